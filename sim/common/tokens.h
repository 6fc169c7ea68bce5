/* Dependency tokens shared by the timed simulators. A token carries the completion time (cycle)
 * of the instruction that produced it; the consumer may start no earlier than that time.
 *
 * accel_fifo: an in-order token queue (VTA's four module queues, DPU's DPON/DPBY FIFOs). Its
 * capacity is the number of pushes counted in a static pass over the stream, so a push can never
 * overflow it. accel_sem: a counting semaphore whose tokens are taken earliest first (a binary
 * min-heap of times; MARSELLUS's semaphores, where several producers signal one consumer).
 */
#ifndef ACCEL_COMMON_TOKENS_H
#define ACCEL_COMMON_TOKENS_H

#include <stdint.h>
#include <stdlib.h>

#include "common/mem.h"

typedef struct {
    uint64_t *t; /* completion times carried by the tokens */
    uint64_t head, tail, cap;
} accel_fifo;

/* Allocates room for cap tokens (at least one slot); returns 0 when out of host memory. */
static inline int accel_fifo_init(accel_fifo *f, uint64_t cap)
{
    f->head = f->tail = 0;
    f->cap = cap;
    f->t = (uint64_t *)accel_calloc(cap, sizeof(uint64_t));
    return f->t != NULL;
}

static inline int accel_fifo_empty(const accel_fifo *f) { return f->head == f->tail; }

/* Time carried by the oldest token; the FIFO must not be empty. */
static inline uint64_t accel_fifo_front(const accel_fifo *f) { return f->t[f->head]; }

static inline void accel_fifo_pop(accel_fifo *f) { f->head++; }

/* Cannot overflow when cap counts the pushes of the stream. */
static inline void accel_fifo_push(accel_fifo *f, uint64_t t) { f->t[f->tail++] = t; }

/* Tokens pushed and not popped. */
static inline uint64_t accel_fifo_left(const accel_fifo *f) { return f->tail - f->head; }

static inline void accel_fifo_free(accel_fifo *f)
{
    free(f->t);
    f->t = NULL;
}

typedef struct {
    uint64_t *t; /* binary min-heap of token times */
    uint64_t n, cap;
} accel_sem;

/* Allocates room for cap tokens (at least one slot); returns 0 when out of host memory. */
int accel_sem_init(accel_sem *h, uint64_t cap);
/* Adds a token; the count of signals must not exceed cap. */
void accel_sem_push(accel_sem *h, uint64_t t);
/* Removes and returns the earliest token; the semaphore must not be empty. */
uint64_t accel_sem_pop(accel_sem *h);
void accel_sem_free(accel_sem *h);

static inline int accel_sem_empty(const accel_sem *h) { return h->n == 0; }
/* Time of the earliest token; the semaphore must not be empty. */
static inline uint64_t accel_sem_front(const accel_sem *h) { return h->t[0]; }

#endif
