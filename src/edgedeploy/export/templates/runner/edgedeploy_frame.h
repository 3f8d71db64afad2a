/* edgedeploy_frame.h: the frame codec of the edgedeploy device runner (protocol version 1).
 *
 * Written by `edgedeploy export`; plain C99, no dynamic allocation, no dependency but <stdint.h>
 * and <stddef.h>, so the same file builds for a Cortex-M and for a host test.
 *
 * A frame, all numbers little-endian:
 *
 *   offset  bytes  field
 *   0       2      sync: 0xED 0x5A
 *   2       1      type (EDF_HELLO, EDF_INFER, ... below; an answer is the request's type | 0x80)
 *   3       1      sequence number, chosen by the host and echoed in the answer
 *   4       4      payload length N (uint32)
 *   8       N      payload
 *   8+N     4      CRC-32 of bytes 2 .. 7+N (type, sequence, length, payload)
 *
 * The CRC is the common CRC-32 (IEEE 802.3, as zlib's crc32() and Python's zlib.crc32):
 * polynomial 0x04C11DB7 reflected (0xEDB88320), initial value 0xFFFFFFFF, final XOR 0xFFFFFFFF.
 * edf_crc32(0, "123456789", 9) == 0xCBF43926.
 *
 * The decoder takes one byte at a time. It hunts for the two sync bytes, so noise between frames
 * is skipped. A frame whose length exceeds the payload buffer (EDF_ERR_TOO_LONG), whose CRC does
 * not match (EDF_ERR_CRC), or that stops arriving for longer than the timeout between two bytes
 * (EDF_ERR_TIMEOUT, see edf_decoder_poll) ends as an error event, and the decoder hunts again.
 * After EDF_ERR_TOO_LONG the bytes that follow are dropped until the line has been quiet for the
 * same timeout, since the length that would tell where the frame ends cannot be trusted.
 */
#ifndef EDGEDEPLOY_FRAME_H
#define EDGEDEPLOY_FRAME_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define EDF_PROTOCOL_VERSION 1u
#define EDF_SYNC0 0xEDu
#define EDF_SYNC1 0x5Au
#define EDF_HEADER_BYTES 8u
#define EDF_CRC_BYTES 4u
#define EDF_REPLY 0x80u

/* Frame types. */
#define EDF_HELLO 0x01u  /* host: empty payload; device: EDF_HELLO|EDF_REPLY with edr_hello (edgedeploy_runner.h) */
#define EDF_INFER 0x02u  /* host: the input bytes; device: EDF_INFER|EDF_REPLY with the result header and outputs */
#define EDF_ERROR 0x7Fu  /* device: one error code byte, then an ASCII message */

/* Error codes (the first payload byte of an EDF_ERROR frame). */
#define EDF_ERR_CRC 1u          /* the frame's CRC did not match */
#define EDF_ERR_TOO_LONG 2u     /* the length exceeds what the device can take */
#define EDF_ERR_TIMEOUT 3u      /* the frame stopped arriving part way */
#define EDF_ERR_UNKNOWN_TYPE 4u /* a well-formed frame of a type the device does not know */
#define EDF_ERR_BAD_SIZE 5u     /* an EDF_INFER payload that is not the model's input size */
#define EDF_ERR_INVOKE 6u       /* the model failed to run */

/* CRC-32 (see above): start with crc = 0, feed data in any number of pieces. */
uint32_t edf_crc32(uint32_t crc, const uint8_t *data, size_t n);

/* The 8 header bytes of a frame. */
void edf_header(uint8_t out[EDF_HEADER_BYTES], uint8_t type, uint8_t seq, uint32_t length);

/* Writing a frame in pieces: edf_writer_begin, any number of edf_writer_put (length bytes in all),
 * edf_writer_end (the CRC). `write` sends bytes; the frame is never held in memory whole. */
typedef void (*edf_write_fn)(void *io, const uint8_t *data, size_t n);
typedef struct {
  edf_write_fn write;
  void *io;
  uint32_t crc;
} edf_writer;
void edf_writer_begin(edf_writer *w, edf_write_fn write, void *io, uint8_t type, uint8_t seq, uint32_t length);
void edf_writer_put(edf_writer *w, const void *data, size_t n);
void edf_writer_end(edf_writer *w);

/* What edf_decoder_feed and edf_decoder_poll report. */
typedef enum { EDF_EVENT_NONE = 0, EDF_EVENT_FRAME = 1, EDF_EVENT_ERROR = 2 } edf_event;

typedef struct {
  uint8_t *payload;  /* where payloads are written (the caller's buffer) */
  uint32_t capacity; /* its size: longer frames are EDF_ERR_TOO_LONG */
  uint32_t timeout_ms;
  /* the last frame or error */
  uint8_t type;
  uint8_t seq;
  uint8_t error; /* EDF_ERR_* after EDF_EVENT_ERROR */
  uint32_t length;
  /* internal state */
  uint8_t state;
  uint8_t header[EDF_HEADER_BYTES];
  uint32_t pos;
  uint32_t crc;
  uint32_t crc_rx;
  uint32_t last_ms;
} edf_decoder;

void edf_decoder_init(edf_decoder *d, uint8_t *payload, uint32_t capacity, uint32_t timeout_ms);
/* One received byte at time now_ms (any millisecond clock that wraps at 2^32). */
edf_event edf_decoder_feed(edf_decoder *d, uint8_t byte, uint32_t now_ms);
/* Call while no byte arrives: EDF_EVENT_ERROR (EDF_ERR_TIMEOUT) once a started frame has waited
 * longer than timeout_ms for its next byte. */
edf_event edf_decoder_poll(edf_decoder *d, uint32_t now_ms);
/* Whether a frame is part way in (or bytes are being dropped after EDF_ERR_TOO_LONG). */
int edf_decoder_busy(const edf_decoder *d);

#ifdef __cplusplus
}
#endif

#endif /* EDGEDEPLOY_FRAME_H */
