#if !defined(_WIN32) && !defined(_POSIX_C_SOURCE)
#define _POSIX_C_SOURCE 200809L /* sigaction under -std=c99 */
#endif
#include "common/status.h"

#include <stdarg.h>
#include <stdio.h>
#if !defined(_WIN32)
#include <signal.h>
#include <string.h>
#endif

int accelsim_abi_version(void) { return ACCELSIM_ABI_VERSION; }

#if defined(__GNUC__)
int accel_stop_flag = 0;

void accelsim_request_stop(void) { __atomic_store_n(&accel_stop_flag, 1, __ATOMIC_SEQ_CST); }
void accelsim_clear_stop(void) { __atomic_store_n(&accel_stop_flag, 0, __ATOMIC_SEQ_CST); }
#else
volatile int accel_stop_flag = 0;

void accelsim_request_stop(void) { accel_stop_flag = 1; }
void accelsim_clear_stop(void) { accel_stop_flag = 0; }
#endif

int accelsim_stop_requested(void) { return accel_should_stop(); }

#if !defined(_WIN32)
static volatile sig_atomic_t sigint_seen = 0;
static struct sigaction sigint_saved;

static void on_sigint(int sig)
{
    (void)sig;
    sigint_seen = 1;
    accelsim_request_stop(); /* one lock-free store: async-signal-safe */
}

int accelsim_sigint_begin(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigint_seen = 0;
    return sigaction(SIGINT, &sa, &sigint_saved) == 0 ? 0 : -1;
}

int accelsim_sigint_end(void)
{
    sigaction(SIGINT, &sigint_saved, NULL);
    return sigint_seen ? 1 : 0;
}
#else
int accelsim_sigint_begin(void) { return -1; }
int accelsim_sigint_end(void) { return 0; }
#endif

int accel_interrupted(accel_err *e, const char *what, uint64_t index, const char *name, uint64_t cycle)
{
    return accel_fail(e, ACCEL_ERR_INTERRUPTED, "interrupted at %s %llu (%s), cycle %llu", what,
                      (unsigned long long)index, name ? name : "?", (unsigned long long)cycle);
}

const char *accel_status_name(int code)
{
    switch (code) {
    case ACCEL_OK: return "ok";
    case ACCEL_ERR_ARG: return "argument";
    case ACCEL_ERR_CONFIG: return "config";
    case ACCEL_ERR_DECODE: return "decode";
    case ACCEL_ERR_BOUNDS: return "bounds";
    case ACCEL_ERR_PROTOCOL: return "protocol";
    case ACCEL_ERR_BUDGET: return "budget";
    case ACCEL_ERR_IO: return "io";
    case ACCEL_ERR_NOMEM: return "nomem";
    case ACCEL_ERR_INTERRUPTED: return "interrupted";
    default: return "unknown";
    }
}

void accel_err_init(accel_err *e, char *buf, uint64_t len)
{
    e->buf = buf;
    e->len = (buf && len > 0) ? (len > (uint64_t)SIZE_MAX ? SIZE_MAX : (size_t)len) : 0;
    e->code = ACCEL_OK;
    if (e->len)
        e->buf[0] = '\0';
}

int accel_fail(accel_err *e, int code, const char *fmt, ...)
{
    if (e->code != ACCEL_OK)
        return e->code;
    e->code = code;
    if (e->len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(e->buf, e->len, fmt, ap);
        va_end(ap);
        /* keep the message on one line */
        for (char *p = e->buf; *p; p++)
            if (*p == '\n' || *p == '\r')
                *p = ' ';
    }
    return code;
}
