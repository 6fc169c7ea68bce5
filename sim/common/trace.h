/* Chrome / Perfetto trace writer ("JSON Object Format": {"traceEvents": [...]}).
 *
 * A trace file is always valid JSON between runs: accel_trace_open() either creates the file
 * (append = 0, or the file is missing/empty) or re-opens a file this writer produced and continues
 * it in place of its closing "\n]}\n" (append = 1), so several simulator runs can be written into
 * one trace, each shifted by a time offset chosen by the caller. Event names and args are
 * written as given: callers pass plain ASCII names and a pre-formatted JSON args object.
 */
#ifndef ACCEL_COMMON_TRACE_H
#define ACCEL_COMMON_TRACE_H

#include <stdio.h>

#include "common/status.h"

typedef struct {
    FILE *f;
    int first; /* no event written yet: the next one needs no leading comma */
} accel_trace;

/* Opens (creates / continues) the trace at path. On failure records ACCEL_ERR_IO in err. */
int accel_trace_open(accel_trace *t, const char *path, int append, accel_err *err);

/* Metadata event naming a track: {"ph": "M", "name": "thread_name", ...}. */
void accel_trace_thread_name(accel_trace *t, int pid, int tid, const char *name);
void accel_trace_process_name(accel_trace *t, int pid, const char *name);

/* Complete event {"ph": "X"}; args_json is a JSON object text (e.g. "{\"insn\": 3}") or NULL. */
void accel_trace_complete(accel_trace *t, const char *name, int pid, int tid, double ts_us,
                          double dur_us, const char *args_json);

/* Writes the closing bracket and closes the file; records ACCEL_ERR_IO on a write error.
 * Safe to call on a trace that was never opened. */
int accel_trace_close(accel_trace *t, const char *path, accel_err *err);

#endif
