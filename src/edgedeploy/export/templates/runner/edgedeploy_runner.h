/* edgedeploy_runner.h: the device side of edgedeploy's hardware-in-the-loop tests.
 *
 * Written by `edgedeploy export`; plain C99 on top of edgedeploy_frame.h, no dynamic allocation.
 * The runner reads framed requests from a byte stream, runs the model and answers:
 *
 *   EDF_HELLO  -> who the firmware is: protocol version, the model's sha256 (the host refuses a
 *                 firmware built from another model), input and output sizes, what it can measure
 *   EDF_INFER  -> the outputs of the model on the request's input bytes, the CPU cycles it took
 *                 (where the board gives a cycle counter) and, with EDGEDEPLOY_RUNNER_ETHOSU
 *                 defined and the Arm Ethos-U driver linked, the NPU's PMU counters
 *   bad frame  -> an EDF_ERROR frame (CRC, too long, cut off, unknown type, wrong size); the
 *                 runner then waits for the next frame
 *
 * The board supplies the bytes (edr_read_fn, edr_write_fn), a millisecond clock to time out
 * frames that stop part way, optionally a cycle counter, and the model (edr_invoke_fn).
 * edgedeploy_runner_an547.c has them for the Arm MPS3 AN547 (QEMU's mps3-an547): UART0, SysTick.
 *
 * HELLO answer payload (little-endian):
 *   0 u8 protocol version (EDF_PROTOCOL_VERSION)   1 u8 flags (EDR_HAS_*)   2 u8 PMU event counters
 *   3 u8 0   4 u32 input bytes   8 u32 output bytes   12 u32 largest request payload
 *   16 char[64] model sha256 (lowercase hex)   80 char[] name (up to 63 bytes, no terminator)
 * INFER answer payload:
 *   0 u8 flags (EDR_HAS_* measured for this inference)   1 u8 PMU event counters (n)   2 u16 0
 *   4 u64 CPU cycles   12 u32 milliseconds (board clock)   16 u64 NPU cycles (PMU cycle counter)
 *   24 u32[n] PMU event counts   24+4n the output bytes (all outputs one after another)
 */
#ifndef EDGEDEPLOY_RUNNER_H
#define EDGEDEPLOY_RUNNER_H

#include <stddef.h>
#include <stdint.h>

#include "edgedeploy_frame.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDR_HAS_CYCLES 0x01u /* a CPU cycle counter (e.g. DWT CYCCNT) */
#define EDR_HAS_PMU 0x02u    /* Ethos-U PMU counters */
#define EDR_HAS_CLOCK 0x04u  /* a millisecond clock */

#define EDR_HELLO_BYTES 80u
#define EDR_NAME_MAX 63u
#define EDR_RESULT_BYTES 24u
#define EDR_DEFAULT_FRAME_TIMEOUT_MS 250u

#ifdef EDGEDEPLOY_RUNNER_ETHOSU
#define EDR_PMU_EVENTS 4u
/* The four PMU events counted (enum ethosu_pmu_event_type of the driver's pmu_ethosu.h, which needs
 * ETHOSU55, ETHOSU65 or ETHOSU85 defined as for the driver's own build); override with -D. */
#if defined(ETHOSU85)
#define EDR_PMU_BUS0 EXT0
#define EDR_PMU_BUS1 EXT1
#else
#define EDR_PMU_BUS0 AXI0
#define EDR_PMU_BUS1 AXI1
#endif
#define EDR_PMU_CAT(a, b, c) a##b##c
#define EDR_PMU_EVENT(bus, what) EDR_PMU_CAT(ETHOSU_PMU_, bus, what)
#ifndef EDR_PMU_EVENT_0
#define EDR_PMU_EVENT_0 EDR_PMU_EVENT(EDR_PMU_BUS0, _RD_DATA_BEAT_RECEIVED)
#endif
#ifndef EDR_PMU_EVENT_1
#define EDR_PMU_EVENT_1 EDR_PMU_EVENT(EDR_PMU_BUS0, _WR_DATA_BEAT_WRITTEN)
#endif
#ifndef EDR_PMU_EVENT_2
#define EDR_PMU_EVENT_2 EDR_PMU_EVENT(EDR_PMU_BUS1, _RD_DATA_BEAT_RECEIVED)
#endif
#ifndef EDR_PMU_EVENT_3
#define EDR_PMU_EVENT_3 ETHOSU_PMU_NPU_IDLE
#endif
#else
#define EDR_PMU_EVENTS 0u
#endif

/* Copies up to n bytes that have arrived into buf and returns how many (0: none yet). Must return
 * soon when nothing has arrived: the runner times out frames between calls. */
typedef size_t (*edr_read_fn)(void *io, uint8_t *buf, size_t n);
/* Sends n bytes; may block until the line has taken them. */
typedef void (*edr_write_fn)(void *io, const uint8_t *data, size_t n);
/* A free-running counter: milliseconds (edr_config.clock_ms) or CPU cycles (edr_config.cycles). */
typedef uint32_t (*edr_counter_fn)(void *io);
/* Runs the model on input (edr_config.input_bytes) and writes edr_config.output_bytes to output;
 * returns 0 on success. */
typedef int (*edr_invoke_fn)(void *model, const uint8_t *input, uint8_t *output);

typedef struct {
  edr_read_fn read;
  edr_write_fn write;
  edr_counter_fn clock_ms; /* required: times out frames that stop part way */
  edr_counter_fn cycles;   /* NULL: no cycle counter */
  void *io;
  edr_invoke_fn invoke;
  void *model;
  uint8_t *input; /* input_bytes: requests are received straight into it */
  uint32_t input_bytes;
  uint8_t *output; /* output_bytes */
  uint32_t output_bytes;
  const char *model_sha256; /* 64 hex digits: the header's NAME_MODEL_SHA256 or NAME_CPU_MODEL_SHA256 */
  const char *name;         /* the bundle's name */
  uint32_t frame_timeout_ms; /* 0: EDR_DEFAULT_FRAME_TIMEOUT_MS */
} edr_config;

typedef struct {
  edr_config cfg;
  edf_decoder decoder;
  uint32_t frames; /* requests answered */
  uint32_t errors; /* error frames sent */
  uint8_t chunk[64];
} edr_runner;

/* 0, or -1 when a required function or buffer is missing or the hash is not 64 hex digits. */
int edr_init(edr_runner *r, const edr_config *cfg);
/* Handles what has arrived (at most one read) and returns. */
void edr_step(edr_runner *r);
/* edr_step forever. */
void edr_run(edr_runner *r);

#ifdef __cplusplus
}
#endif

#endif /* EDGEDEPLOY_RUNNER_H */
