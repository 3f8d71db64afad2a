/* edgedeploy_frame.c: the frame codec of the edgedeploy device runner; see edgedeploy_frame.h.
 * Written by `edgedeploy export`. */
#include "edgedeploy_frame.h"

enum { S_HUNT0 = 0, S_HUNT1, S_HEADER, S_PAYLOAD, S_CRC, S_DROP };

/* CRC-32, reflected polynomial 0xEDB88320, four bits at a time (a 64-byte table). */
static const uint32_t crc_nibble[16] = {
    0x00000000u, 0x1DB71064u, 0x3B6E20C8u, 0x26D930ACu, 0x76DC4190u, 0x6B6B51F4u, 0x4DB26158u, 0x5005713Cu,
    0xEDB88320u, 0xF00F9344u, 0xD6D6A3E8u, 0xCB61B38Cu, 0x9B64C2B0u, 0x86D3D2D4u, 0xA00AE278u, 0xBDBDF21Cu,
};

uint32_t edf_crc32(uint32_t crc, const uint8_t *data, size_t n) {
  size_t i;
  crc = ~crc;
  for (i = 0; i < n; ++i) {
    crc ^= data[i];
    crc = (crc >> 4) ^ crc_nibble[crc & 0x0Fu];
    crc = (crc >> 4) ^ crc_nibble[crc & 0x0Fu];
  }
  return ~crc;
}

static void put_u32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
  p[2] = (uint8_t)(v >> 16);
  p[3] = (uint8_t)(v >> 24);
}

static uint32_t get_u32(const uint8_t *p) {
  return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

void edf_header(uint8_t out[EDF_HEADER_BYTES], uint8_t type, uint8_t seq, uint32_t length) {
  out[0] = (uint8_t)EDF_SYNC0;
  out[1] = (uint8_t)EDF_SYNC1;
  out[2] = type;
  out[3] = seq;
  put_u32(out + 4, length);
}

void edf_writer_begin(edf_writer *w, edf_write_fn write, void *io, uint8_t type, uint8_t seq, uint32_t length) {
  uint8_t header[EDF_HEADER_BYTES];
  edf_header(header, type, seq, length);
  w->write = write;
  w->io = io;
  w->crc = edf_crc32(0, header + 2, EDF_HEADER_BYTES - 2);
  write(io, header, EDF_HEADER_BYTES);
}

void edf_writer_put(edf_writer *w, const void *data, size_t n) {
  if (n == 0) return;
  w->crc = edf_crc32(w->crc, (const uint8_t *)data, n);
  w->write(w->io, (const uint8_t *)data, n);
}

void edf_writer_end(edf_writer *w) {
  uint8_t crc[EDF_CRC_BYTES];
  put_u32(crc, w->crc);
  w->write(w->io, crc, EDF_CRC_BYTES);
}

void edf_decoder_init(edf_decoder *d, uint8_t *payload, uint32_t capacity, uint32_t timeout_ms) {
  d->payload = payload;
  d->capacity = capacity;
  d->timeout_ms = timeout_ms;
  d->type = 0;
  d->seq = 0;
  d->error = 0;
  d->length = 0;
  d->state = S_HUNT0;
  d->pos = 0;
  d->crc = 0;
  d->crc_rx = 0;
  d->last_ms = 0;
}

static edf_event fail(edf_decoder *d, uint8_t error, uint8_t next_state) {
  d->error = error;
  d->state = next_state;
  return EDF_EVENT_ERROR;
}

static edf_event header_done(edf_decoder *d) {
  d->type = d->header[2];
  d->seq = d->header[3];
  d->length = get_u32(d->header + 4);
  if (d->length > d->capacity) return fail(d, (uint8_t)EDF_ERR_TOO_LONG, S_DROP);
  d->crc = edf_crc32(0, d->header + 2, EDF_HEADER_BYTES - 2);
  d->pos = 0;
  d->crc_rx = 0;
  d->state = d->length ? S_PAYLOAD : S_CRC;
  return EDF_EVENT_NONE;
}

edf_event edf_decoder_feed(edf_decoder *d, uint8_t byte, uint32_t now_ms) {
  d->last_ms = now_ms;
  switch (d->state) {
    case S_HUNT0:
      if (byte == EDF_SYNC0) d->state = S_HUNT1;
      return EDF_EVENT_NONE;
    case S_HUNT1:
      if (byte == EDF_SYNC1) {
        d->header[0] = (uint8_t)EDF_SYNC0;
        d->header[1] = (uint8_t)EDF_SYNC1;
        d->pos = 2;
        d->state = S_HEADER;
      } else if (byte != EDF_SYNC0) {
        d->state = S_HUNT0;
      }
      return EDF_EVENT_NONE;
    case S_HEADER:
      d->header[d->pos++] = byte;
      return d->pos == EDF_HEADER_BYTES ? header_done(d) : EDF_EVENT_NONE;
    case S_PAYLOAD:
      d->payload[d->pos++] = byte;
      if (d->pos == d->length) {
        d->pos = 0;
        d->state = S_CRC;
      }
      return EDF_EVENT_NONE;
    case S_CRC:
      d->crc_rx |= (uint32_t)byte << (8u * d->pos);
      if (++d->pos < EDF_CRC_BYTES) return EDF_EVENT_NONE;
      d->state = S_HUNT0;
      d->crc = edf_crc32(d->crc, d->payload, d->length);
      if (d->crc != d->crc_rx) return fail(d, (uint8_t)EDF_ERR_CRC, S_HUNT0);
      return EDF_EVENT_FRAME;
    default: /* S_DROP: the rest of a frame too long to take; left by edf_decoder_poll */
      return EDF_EVENT_NONE;
  }
}

edf_event edf_decoder_poll(edf_decoder *d, uint32_t now_ms) {
  if (d->state == S_HUNT0 || (uint32_t)(now_ms - d->last_ms) <= d->timeout_ms) return EDF_EVENT_NONE;
  if (d->state == S_HUNT1 || d->state == S_DROP) { /* a lone sync byte is noise; a dropped frame is over */
    d->state = S_HUNT0;
    return EDF_EVENT_NONE;
  }
  return fail(d, (uint8_t)EDF_ERR_TIMEOUT, S_HUNT0);
}

int edf_decoder_busy(const edf_decoder *d) { return d->state != S_HUNT0; }
