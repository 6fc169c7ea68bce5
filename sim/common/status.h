/* Status codes and the one-line error message buffer shared by every simulator target.
 *
 * Every exported entry point returns an accel_status (0 = ok) and, on failure, writes one line of
 * text (no newline) into a caller-provided buffer: what went wrong and where, e.g.
 * "insn 17 (LOAD INP): DRAM range [4096, 8192) exceeds DRAM size 6000". Only the first error of a
 * run is kept; later calls to accel_fail() leave it untouched.
 */
#ifndef ACCEL_COMMON_STATUS_H
#define ACCEL_COMMON_STATUS_H

#include <stddef.h>
#include <stdint.h>

/* Bumped whenever an exported signature or struct layout changes; checked by tvm_accel/simlib.py. */
#define ACCELSIM_ABI_VERSION 4

typedef enum {
    ACCEL_OK = 0,
    ACCEL_ERR_ARG = 1,      /* bad argument from the host (NULL pointer, size not a multiple) */
    ACCEL_ERR_CONFIG = 2,   /* hardware config outside the supported limits */
    ACCEL_ERR_DECODE = 3,   /* unknown opcode / memory type / ALU opcode, misused flag */
    ACCEL_ERR_BOUNDS = 4,   /* SRAM / DRAM / uop index outside the memory it names */
    ACCEL_ERR_PROTOCOL = 5, /* token protocol: deadlock, unbalanced tokens, missing FINISH */
    ACCEL_ERR_BUDGET = 6,   /* cycle budget exceeded */
    ACCEL_ERR_IO = 7,       /* trace file could not be written */
    ACCEL_ERR_NOMEM = 8,    /* host allocation failed */
    ACCEL_ERR_INTERRUPTED = 9 /* a stop was requested (accelsim_request_stop, e.g. on Ctrl-C) */
} accel_status;

typedef struct {
    char *buf;   /* may be NULL */
    size_t len;  /* capacity of buf in bytes, including the terminating NUL */
    int code;    /* first error recorded, ACCEL_OK if none */
} accel_err;

int accelsim_abi_version(void);

/* Name of a status code ("bounds", "protocol", ...); never NULL. */
const char *accel_status_name(int code);

void accel_err_init(accel_err *e, char *buf, uint64_t len);

/* Record an error (printf-style one-line message) unless one is already recorded; returns the
 * recorded code so callers can write `return accel_fail(e, ACCEL_ERR_BOUNDS, ...)`. */
#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
int accel_fail(accel_err *e, int code, const char *fmt, ...);

/* Process-wide stop request (Ctrl-C). accelsim_request_stop() may be called from any thread, or
 * from a signal handler, while simulations run; every simulator polls the flag between
 * instructions and every few thousand inner-loop iterations of a long instruction, and returns
 * ACCEL_ERR_INTERRUPTED ("interrupted at insn 17 (GEMM), cycle 123456") within milliseconds. The
 * flag stays set (every run started meanwhile stops at once) until accelsim_clear_stop(). */
void accelsim_request_stop(void);
void accelsim_clear_stop(void);
int accelsim_stop_requested(void);

/* Ctrl-C for a call made on the caller's own (main) thread: begin() installs a SIGINT handler
 * that requests the stop (0 on success, -1 where there is no sigaction); end() puts the
 * previous handler back and says whether a SIGINT arrived in between (1), so the caller can
 * clear the stop and raise its own interrupt. The pair is not reentrant: one call at a time. */
int accelsim_sigint_begin(void);
int accelsim_sigint_end(void);

#if defined(__GNUC__)
extern int accel_stop_flag __attribute__((visibility("hidden")));
/* One relaxed load (a plain load on x86/ARM), cheap enough for inner loops. */
static inline int accel_should_stop(void) { return __atomic_load_n(&accel_stop_flag, __ATOMIC_RELAXED) != 0; }
#else
extern volatile int accel_stop_flag;
static inline int accel_should_stop(void) { return accel_stop_flag != 0; }
#endif

/* Inner loops of a long instruction poll the flag once per this many iterations of their
 * cheapest level (e.g. VTA micro-ops), so a stop is seen within a few milliseconds. */
#define ACCEL_STOP_POLL 256

/* Records ACCEL_ERR_INTERRUPTED: "interrupted at <what> <index> (<name>), cycle <cycle>"; what is
 * "insn" or "cmd". */
int accel_interrupted(accel_err *e, const char *what, uint64_t index, const char *name, uint64_t cycle);

#endif
