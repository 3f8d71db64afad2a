/* edgedeploy_runner.c: the device side of edgedeploy's hardware-in-the-loop tests; see
 * edgedeploy_runner.h. Written by `edgedeploy export`. */
#include "edgedeploy_runner.h"

#ifdef EDGEDEPLOY_RUNNER_ETHOSU
#include "ethosu_driver.h"
#include "pmu_ethosu.h"

/* The driver calls these around each NPU job: counts add up over the jobs of one inference. */
static uint64_t pmu_cycles;
static uint32_t pmu_counts[EDR_PMU_EVENTS];

void ethosu_inference_begin(struct ethosu_driver *drv, void *user_arg) {
  (void)user_arg;
  ETHOSU_PMU_Enable(drv);
  ETHOSU_PMU_Set_EVTYPER(drv, 0, EDR_PMU_EVENT_0);
  ETHOSU_PMU_Set_EVTYPER(drv, 1, EDR_PMU_EVENT_1);
  ETHOSU_PMU_Set_EVTYPER(drv, 2, EDR_PMU_EVENT_2);
  ETHOSU_PMU_Set_EVTYPER(drv, 3, EDR_PMU_EVENT_3);
  ETHOSU_PMU_EVCNTR_ALL_Reset(drv);
  ETHOSU_PMU_CYCCNT_Reset(drv);
  ETHOSU_PMU_CNTR_Enable(drv, ETHOSU_PMU_CCNT_Msk | 0xFu);
}

void ethosu_inference_end(struct ethosu_driver *drv, void *user_arg) {
  uint32_t i;
  (void)user_arg;
  ETHOSU_PMU_CNTR_Disable(drv, ETHOSU_PMU_CCNT_Msk | 0xFu);
  pmu_cycles += ETHOSU_PMU_Get_CCNTR(drv);
  for (i = 0; i < EDR_PMU_EVENTS; ++i) pmu_counts[i] += ETHOSU_PMU_Get_EVCNTR(drv, i);
  ETHOSU_PMU_Disable(drv);
}
#endif

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static void put_u64(uint8_t *p, uint64_t v) {
  put_u32(p, (uint32_t)v);
  put_u32(p + 4, (uint32_t)(v >> 32));
}

static size_t text_length(const char *s, size_t max) {
  size_t n = 0;
  while (s != NULL && n < max && s[n] != '\0') ++n;
  return n;
}

static int is_sha256(const char *s) {
  size_t i;
  if (s == NULL) return 0;
  for (i = 0; i < 64u; ++i) {
    char c = s[i];
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) return 0;
  }
  return s[64] == '\0';
}

int edr_init(edr_runner *r, const edr_config *cfg) {
  if (cfg == NULL || cfg->read == NULL || cfg->write == NULL || cfg->clock_ms == NULL || cfg->invoke == NULL ||
      cfg->input == NULL || cfg->output == NULL || cfg->input_bytes == 0u || !is_sha256(cfg->model_sha256)) {
    return -1;
  }
  r->cfg = *cfg;
  if (r->cfg.frame_timeout_ms == 0u) r->cfg.frame_timeout_ms = EDR_DEFAULT_FRAME_TIMEOUT_MS;
  edf_decoder_init(&r->decoder, r->cfg.input, r->cfg.input_bytes, r->cfg.frame_timeout_ms);
  r->frames = 0;
  r->errors = 0;
  return 0;
}

static void send_error(edr_runner *r, uint8_t code, uint8_t seq, const char *message) {
  edf_writer w;
  uint32_t n = (uint32_t)text_length(message, 120u);
  edf_writer_begin(&w, r->cfg.write, r->cfg.io, (uint8_t)EDF_ERROR, seq, 1u + n);
  edf_writer_put(&w, &code, 1u);
  edf_writer_put(&w, message, n);
  edf_writer_end(&w);
  r->errors++;
}

static uint8_t measures(const edr_runner *r) {
  uint8_t flags = (uint8_t)EDR_HAS_CLOCK;
  if (r->cfg.cycles != NULL) flags |= (uint8_t)EDR_HAS_CYCLES;
  if (EDR_PMU_EVENTS > 0u) flags |= (uint8_t)EDR_HAS_PMU;
  return flags;
}

static void send_hello(edr_runner *r, uint8_t seq) {
  uint8_t p[EDR_HELLO_BYTES];
  uint32_t name_len = (uint32_t)text_length(r->cfg.name, EDR_NAME_MAX);
  edf_writer w;
  size_t i;
  p[0] = (uint8_t)EDF_PROTOCOL_VERSION;
  p[1] = measures(r);
  p[2] = (uint8_t)EDR_PMU_EVENTS;
  p[3] = 0u;
  put_u32(p + 4, r->cfg.input_bytes);
  put_u32(p + 8, r->cfg.output_bytes);
  put_u32(p + 12, r->cfg.input_bytes);
  for (i = 0; i < 64u; ++i) p[16 + i] = (uint8_t)r->cfg.model_sha256[i];
  edf_writer_begin(&w, r->cfg.write, r->cfg.io, (uint8_t)(EDF_HELLO | EDF_REPLY), seq, EDR_HELLO_BYTES + name_len);
  edf_writer_put(&w, p, EDR_HELLO_BYTES);
  edf_writer_put(&w, r->cfg.name, name_len);
  edf_writer_end(&w);
}

static void infer(edr_runner *r, uint8_t seq) {
  uint8_t head[EDR_RESULT_BYTES + 4u * (EDR_PMU_EVENTS ? EDR_PMU_EVENTS : 1u)];
  uint32_t start_ms, start_cycles = 0u, cycles = 0u, ms;
  uint64_t npu_cycles = 0u;
  uint32_t i, head_bytes = EDR_RESULT_BYTES + 4u * EDR_PMU_EVENTS;
  edf_writer w;
  int status;
#ifdef EDGEDEPLOY_RUNNER_ETHOSU
  pmu_cycles = 0u;
  for (i = 0; i < EDR_PMU_EVENTS; ++i) pmu_counts[i] = 0u;
#endif
  if (r->decoder.length != r->cfg.input_bytes) {
    send_error(r, (uint8_t)EDF_ERR_BAD_SIZE, seq, "the input is not the model's input size");
    return;
  }
  start_ms = r->cfg.clock_ms(r->cfg.io);
  if (r->cfg.cycles != NULL) start_cycles = r->cfg.cycles(r->cfg.io);
  status = r->cfg.invoke(r->cfg.model, r->cfg.input, r->cfg.output);
  if (r->cfg.cycles != NULL) cycles = r->cfg.cycles(r->cfg.io) - start_cycles;
  ms = r->cfg.clock_ms(r->cfg.io) - start_ms;
  if (status != 0) {
    send_error(r, (uint8_t)EDF_ERR_INVOKE, seq, "the model failed to run");
    return;
  }
#ifdef EDGEDEPLOY_RUNNER_ETHOSU
  npu_cycles = pmu_cycles;
  for (i = 0; i < EDR_PMU_EVENTS; ++i) put_u32(head + EDR_RESULT_BYTES + 4u * i, pmu_counts[i]);
#endif
  head[0] = measures(r);
  head[1] = (uint8_t)EDR_PMU_EVENTS;
  head[2] = 0u;
  head[3] = 0u;
  put_u64(head + 4, cycles);
  put_u32(head + 12, ms);
  put_u64(head + 16, npu_cycles);
  edf_writer_begin(&w, r->cfg.write, r->cfg.io, (uint8_t)(EDF_INFER | EDF_REPLY), seq, head_bytes + r->cfg.output_bytes);
  edf_writer_put(&w, head, head_bytes);
  edf_writer_put(&w, r->cfg.output, r->cfg.output_bytes);
  edf_writer_end(&w);
  (void)i;
}

static const char *error_text(uint8_t code) {
  switch (code) {
    case EDF_ERR_CRC: return "crc mismatch";
    case EDF_ERR_TOO_LONG: return "frame longer than the device takes";
    case EDF_ERR_TIMEOUT: return "frame cut off";
    default: return "bad frame";
  }
}

static void handle(edr_runner *r, edf_event event) {
  const edf_decoder *d = &r->decoder;
  if (event == EDF_EVENT_ERROR) {
    send_error(r, d->error, d->seq, error_text(d->error));
    return;
  }
  r->frames++;
  if (d->type == EDF_HELLO) {
    send_hello(r, d->seq);
  } else if (d->type == EDF_INFER) {
    infer(r, d->seq);
  } else {
    send_error(r, (uint8_t)EDF_ERR_UNKNOWN_TYPE, d->seq, "unknown frame type");
  }
}

void edr_step(edr_runner *r) {
  size_t n = r->cfg.read(r->cfg.io, r->chunk, sizeof r->chunk);
  size_t i;
  edf_event event;
  if (n == 0u) {
    event = edf_decoder_poll(&r->decoder, r->cfg.clock_ms(r->cfg.io));
    if (event != EDF_EVENT_NONE) handle(r, event);
    return;
  }
  for (i = 0; i < n; ++i) {
    event = edf_decoder_feed(&r->decoder, r->chunk[i], r->cfg.clock_ms(r->cfg.io));
    if (event != EDF_EVENT_NONE) handle(r, event);
  }
}

void edr_run(edr_runner *r) {
  for (;;) edr_step(r);
}
