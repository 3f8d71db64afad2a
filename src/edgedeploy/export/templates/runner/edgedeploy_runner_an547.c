/* edgedeploy_runner_an547.c: board support of the edgedeploy runner for the Arm MPS3 AN547; see
 * edgedeploy_runner_an547.h. Written by `edgedeploy export`. */
#include "edgedeploy_runner_an547.h"

#define REG(addr) (*(volatile uint32_t *)(uintptr_t)(addr))

/* CMSDK APB UART */
#define UART_DATA(b) REG((b) + 0x000u)
#define UART_STATE(b) REG((b) + 0x004u)
#define UART_CTRL(b) REG((b) + 0x008u)
#define UART_BAUDDIV(b) REG((b) + 0x010u)
#define UART_STATE_TX_FULL 0x1u
#define UART_STATE_RX_FULL 0x2u
#define UART_CTRL_TX_EN 0x1u
#define UART_CTRL_RX_EN 0x2u

/* Armv8-M system registers */
#define SYST_CSR REG(0xE000E010u)
#define SYST_RVR REG(0xE000E014u)
#define SYST_CVR REG(0xE000E018u)
#define DEMCR REG(0xE000EDFCu)
#define DEMCR_TRCENA (1u << 24)
#define DWT_CTRL REG(0xE0001000u)
#define DWT_CYCCNT REG(0xE0001004u)
#define DWT_CTRL_CYCCNTENA 0x1u
#define DWT_CTRL_NOCYCCNT (1u << 25)

static volatile uint32_t ticks_ms;
static int cycle_counter;

void SysTick_Handler(void);
void SysTick_Handler(void) { ticks_ms++; }

static int probe_cycle_counter(void) {
  volatile uint32_t spin;
  uint32_t before;
  DEMCR |= DEMCR_TRCENA;
  if (DWT_CTRL & DWT_CTRL_NOCYCCNT) return 0;
  DWT_CYCCNT = 0u;
  DWT_CTRL |= DWT_CTRL_CYCCNTENA;
  before = DWT_CYCCNT;
  for (spin = 0u; spin < 64u; ++spin) {
  }
  return DWT_CYCCNT != before;
}

void edr_an547_init(edr_config *cfg) {
  UART_BAUDDIV(EDR_AN547_UART0) = EDR_AN547_CORE_HZ / EDR_AN547_BAUD;
  UART_CTRL(EDR_AN547_UART0) = UART_CTRL_TX_EN | UART_CTRL_RX_EN;
  SYST_RVR = EDR_AN547_CORE_HZ / 1000u - 1u;
  SYST_CVR = 0u;
  SYST_CSR = 0x7u; /* processor clock, interrupt, enable */
#if defined(__ARM_ARCH)
  __asm volatile("cpsie i" ::: "memory");
#endif
  cycle_counter = probe_cycle_counter();
  cfg->read = edr_an547_read;
  cfg->write = edr_an547_write;
  cfg->clock_ms = edr_an547_clock_ms;
  cfg->cycles = cycle_counter ? edr_an547_cycles : NULL;
  cfg->io = NULL;
}

size_t edr_an547_read(void *io, uint8_t *buf, size_t n) {
  size_t got = 0u;
  (void)io;
  while (got < n && (UART_STATE(EDR_AN547_UART0) & UART_STATE_RX_FULL)) {
    buf[got++] = (uint8_t)UART_DATA(EDR_AN547_UART0);
  }
  return got;
}

void edr_an547_write(void *io, const uint8_t *data, size_t n) {
  size_t i;
  (void)io;
  for (i = 0u; i < n; ++i) {
    while (UART_STATE(EDR_AN547_UART0) & UART_STATE_TX_FULL) {
    }
    UART_DATA(EDR_AN547_UART0) = data[i];
  }
}

uint32_t edr_an547_clock_ms(void *io) {
  (void)io;
  return ticks_ms;
}

uint32_t edr_an547_cycles(void *io) {
  (void)io;
  return DWT_CYCCNT;
}

int edr_an547_has_cycle_counter(void) { return cycle_counter; }
