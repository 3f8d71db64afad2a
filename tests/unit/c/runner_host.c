/* The bundle's device runner built for the host, for the unit tests of the frame codec and runner.
 *
 *   runner_host crc HEX                       CRC-32 of the bytes
 *   runner_host encode TYPE SEQ HEX           one frame, as hex
 *   runner_host decode CAPACITY TIMEOUT_MS    reads lines "feed HEX NOW_MS" / "poll NOW_MS" on stdin,
 *                                             prints "frame TYPE SEQ HEX" / "error CODE SEQ" per event
 *   runner_host serve SHA256 IN OUT [corrupt] the runner on the byte stream on fds 0 (read) and 1 (write);
 *                                             the model: out[j] = (sum of the input bytes + 7 j) mod 256;
 *                                             "corrupt" flips a bit of the 11th byte it writes
 */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "edgedeploy_runner.h"

static int unhex(const char *s, uint8_t *out, size_t cap) {
  size_t n = strlen(s) / 2, i;
  if (n > cap) return -1;
  for (i = 0; i < n; ++i) {
    unsigned v;
    if (sscanf(s + 2 * i, "%2x", &v) != 1) return -1;
    out[i] = (uint8_t)v;
  }
  return (int)n;
}

static void put_hex(const uint8_t *p, size_t n) {
  size_t i;
  for (i = 0; i < n; ++i) printf("%02x", p[i]);
}

static void stdout_write(void *io, const uint8_t *data, size_t n) {
  (void)io;
  put_hex(data, n);
}

static uint8_t big[1 << 16];

static int cmd_decode(uint32_t capacity, uint32_t timeout_ms) {
  static char line[1 << 18];
  static uint8_t bytes[1 << 17];
  edf_decoder d;
  if (capacity > sizeof big) return 2;
  edf_decoder_init(&d, big, capacity, timeout_ms);
  while (fgets(line, sizeof line, stdin) != NULL) {
    static char hex[sizeof line];
    unsigned long now;
    edf_event ev;
    int k, i;
    if (sscanf(line, "feed %s %lu", hex, &now) == 2) {
      k = unhex(hex, bytes, sizeof bytes);
      if (k < 0) return 2;
      for (i = 0; i < k; ++i) {
        ev = edf_decoder_feed(&d, bytes[i], (uint32_t)now);
        if (ev == EDF_EVENT_FRAME) {
          printf("frame %u %u ", d.type, d.seq);
          put_hex(d.payload, d.length);
          printf("\n");
        } else if (ev == EDF_EVENT_ERROR) {
          printf("error %u %u\n", d.error, d.seq);
        }
      }
    } else if (sscanf(line, "poll %lu", &now) == 1) {
      if (edf_decoder_poll(&d, (uint32_t)now) == EDF_EVENT_ERROR) printf("error %u %u\n", d.error, d.seq);
    }
  }
  return 0;
}

/* serve: the runner on fds 0 and 1 */
static int corrupt;
static unsigned long written;

static size_t fd_read(void *io, uint8_t *buf, size_t n) {
  ssize_t got;
  (void)io;
  got = read(0, buf, n);
  if (got == 0) exit(0); /* the other end closed */
  if (got < 0) {
    struct timespec nap = {0, 1000000};
    if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EIO) exit(3); /* EIO: no one on the pty's other side yet */
    nanosleep(&nap, NULL);
    return 0;
  }
  return (size_t)got;
}

static void fd_write(void *io, const uint8_t *data, size_t n) {
  uint8_t copy[256];
  size_t i;
  (void)io;
  while (n > 0) {
    size_t k = n < sizeof copy ? n : sizeof copy, done = 0;
    memcpy(copy, data, k);
    for (i = 0; i < k; ++i, ++written) {
      if (corrupt && written == 10) copy[i] ^= 0x01;
    }
    while (done < k) {
      ssize_t w = write(1, copy + done, k - done);
      if (w < 0 && errno != EAGAIN) exit(3);
      if (w > 0) done += (size_t)w;
    }
    data += k;
    n -= k;
  }
}

static uint32_t now_ms(void *io) {
  struct timespec t;
  (void)io;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint32_t)(t.tv_sec * 1000u + t.tv_nsec / 1000000);
}

static uint32_t now_ns(void *io) {
  struct timespec t;
  (void)io;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (uint32_t)(t.tv_sec * 1000000000u + t.tv_nsec);
}

static uint32_t out_bytes;

static int fake_model(void *model, const uint8_t *input, uint8_t *output) {
  uint32_t sum = 0, i, n = *(const uint32_t *)model;
  for (i = 0; i < n; ++i) sum += input[i];
  for (i = 0; i < out_bytes; ++i) output[i] = (uint8_t)(sum + 7u * i);
  return 0;
}

static int cmd_serve(const char *sha, uint32_t in, uint32_t out) {
  static uint8_t input[1 << 16], output[1 << 16];
  static edr_runner runner;
  edr_config cfg;
  if (in > sizeof input || out > sizeof output) return 2;
  out_bytes = out;
  fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
  memset(&cfg, 0, sizeof cfg);
  cfg.read = fd_read;
  cfg.write = fd_write;
  cfg.clock_ms = now_ms;
  cfg.cycles = now_ns;
  cfg.invoke = fake_model;
  cfg.model = &in;
  cfg.input = input;
  cfg.input_bytes = in;
  cfg.output = output;
  cfg.output_bytes = out;
  cfg.model_sha256 = sha;
  cfg.name = "host_runner";
  cfg.frame_timeout_ms = 200;
  if (edr_init(&runner, &cfg) != 0) return 2;
  fprintf(stderr, "runner_host ready\n");
  edr_run(&runner);
  return 0;
}

int main(int argc, char **argv) {
  static uint8_t buf[1 << 16];
  if (argc == 3 && strcmp(argv[1], "crc") == 0) {
    int n = unhex(argv[2], buf, sizeof buf);
    if (n < 0) return 2;
    printf("%08lx\n", (unsigned long)edf_crc32(0, buf, (size_t)n));
    return 0;
  }
  if (argc == 5 && strcmp(argv[1], "encode") == 0) {
    edf_writer w;
    int n = unhex(argv[4], buf, sizeof buf);
    if (n < 0) return 2;
    edf_writer_begin(&w, stdout_write, NULL, (uint8_t)atoi(argv[2]), (uint8_t)atoi(argv[3]), (uint32_t)n);
    edf_writer_put(&w, buf, (size_t)n / 2);
    edf_writer_put(&w, buf + n / 2, (size_t)n - (size_t)n / 2);
    edf_writer_end(&w);
    printf("\n");
    return 0;
  }
  if (argc == 4 && strcmp(argv[1], "decode") == 0) return cmd_decode((uint32_t)atol(argv[2]), (uint32_t)atol(argv[3]));
  if ((argc == 5 || argc == 6) && strcmp(argv[1], "serve") == 0) {
    corrupt = argc == 6 && strcmp(argv[5], "corrupt") == 0;
    return cmd_serve(argv[2], (uint32_t)atol(argv[3]), (uint32_t)atol(argv[4]));
  }
  fprintf(stderr, "usage: see the comment at the top of runner_host.c\n");
  return 2;
}
