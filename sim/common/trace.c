#include "common/trace.h"

#include <string.h>

static const char TRACE_HEAD[] = "{\"traceEvents\": [\n";
static const char TRACE_TAIL[] = "\n]}\n";

int accel_trace_open(accel_trace *t, const char *path, int append, accel_err *err)
{
    t->f = NULL;
    t->first = 1;
    if (append) {
        FILE *f = fopen(path, "r+b");
        if (f) {
            long size;
            char tail[sizeof(TRACE_TAIL)];
            const long tail_len = (long)(sizeof(TRACE_TAIL) - 1);
            const long head_len = (long)(sizeof(TRACE_HEAD) - 1);
            if (fseek(f, 0, SEEK_END) != 0 || (size = ftell(f)) < 0) {
                fclose(f);
                return accel_fail(err, ACCEL_ERR_IO, "trace %s: cannot seek", path);
            }
            if (size > 0) {
                memset(tail, 0, sizeof(tail));
                if (size < head_len + tail_len || fseek(f, size - tail_len, SEEK_SET) != 0 ||
                    fread(tail, 1, (size_t)tail_len, f) != (size_t)tail_len ||
                    memcmp(tail, TRACE_TAIL, (size_t)tail_len) != 0 ||
                    fseek(f, size - tail_len, SEEK_SET) != 0) {
                    fclose(f);
                    return accel_fail(err, ACCEL_ERR_IO,
                                      "trace %s: cannot append, the file does not end like a trace "
                                      "written by this simulator",
                                      path);
                }
                t->f = f;
                t->first = (size == head_len + tail_len);
                return ACCEL_OK;
            }
            fclose(f);
        }
    }
    t->f = fopen(path, "wb");
    if (!t->f)
        return accel_fail(err, ACCEL_ERR_IO, "trace %s: cannot open for writing", path);
    fputs(TRACE_HEAD, t->f);
    return ACCEL_OK;
}

static void sep(accel_trace *t)
{
    if (!t->first)
        fputs(",\n", t->f);
    t->first = 0;
}

void accel_trace_thread_name(accel_trace *t, int pid, int tid, const char *name)
{
    if (!t->f)
        return;
    sep(t);
    fprintf(t->f, "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
                  "\"args\": {\"name\": \"%s\"}}",
            pid, tid, name);
}

void accel_trace_process_name(accel_trace *t, int pid, const char *name)
{
    if (!t->f)
        return;
    sep(t);
    fprintf(t->f, "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, "
                  "\"args\": {\"name\": \"%s\"}}",
            pid, name);
}

void accel_trace_complete(accel_trace *t, const char *name, int pid, int tid, double ts_us,
                          double dur_us, const char *args_json)
{
    if (!t->f)
        return;
    sep(t);
    fprintf(t->f, "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.9f, "
                  "\"dur\": %.9f",
            name, pid, tid, ts_us, dur_us);
    if (args_json)
        fprintf(t->f, ", \"args\": %s", args_json);
    fputc('}', t->f);
}

int accel_trace_close(accel_trace *t, const char *path, accel_err *err)
{
    int bad;
    if (!t->f)
        return ACCEL_OK;
    fputs(TRACE_TAIL, t->f);
    bad = ferror(t->f);
    if (fclose(t->f) != 0)
        bad = 1;
    t->f = NULL;
    if (bad)
        return accel_fail(err, ACCEL_ERR_IO, "trace %s: write failed", path);
    return ACCEL_OK;
}
