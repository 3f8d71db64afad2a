/* edgedeploy_runner_an547.h: board support of the edgedeploy runner for the Arm MPS3 AN547
 * (Corstone SSE-300 with a Cortex-M55; QEMU's mps3-an547): UART0 as the byte stream, SysTick as the
 * millisecond clock, DWT CYCCNT as the cycle counter. Written by `edgedeploy export`.
 *
 * The UART is the CMSDK APB UART0 at its secure address 0x59303000 (QEMU connects it to the first
 * -serial). This file owns SysTick_Handler: a board whose firmware already uses SysTick gives the
 * runner its own clock instead. */
#ifndef EDGEDEPLOY_RUNNER_AN547_H
#define EDGEDEPLOY_RUNNER_AN547_H

#include "edgedeploy_runner.h"

#ifdef __cplusplus
extern "C" {
#endif

#define EDR_AN547_UART0 0x59303000u
#define EDR_AN547_CORE_HZ 32000000u /* MPS3 FPGA images run the core and the APB at 32 MHz */
#define EDR_AN547_BAUD 115200u

/* Enables UART0 (TX and RX at EDR_AN547_BAUD), a 1 ms SysTick interrupt and, where it counts, the
 * DWT cycle counter; then fills the board's part of cfg (read, write, clock_ms, cycles, io). */
void edr_an547_init(edr_config *cfg);

size_t edr_an547_read(void *io, uint8_t *buf, size_t n);
void edr_an547_write(void *io, const uint8_t *data, size_t n);
uint32_t edr_an547_clock_ms(void *io);
uint32_t edr_an547_cycles(void *io);
/* Whether DWT CYCCNT advances (QEMU does not model it: there cfg.cycles stays NULL). */
int edr_an547_has_cycle_counter(void);

#ifdef __cplusplus
}
#endif

#endif /* EDGEDEPLOY_RUNNER_AN547_H */
