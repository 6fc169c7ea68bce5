/* Semaphore tokens (common/tokens.h): a binary min-heap of completion times. */
#include "common/tokens.h"

int accel_sem_init(accel_sem *h, uint64_t cap)
{
    h->n = 0;
    h->cap = cap;
    h->t = (uint64_t *)accel_calloc(cap ? cap : 1, sizeof(uint64_t));
    return h->t != NULL;
}

static void swap_times(uint64_t *a, uint64_t *b)
{
    uint64_t tmp = *a;
    *a = *b;
    *b = tmp;
}

void accel_sem_push(accel_sem *h, uint64_t t)
{
    uint64_t i = h->n++;
    h->t[i] = t;
    while (i > 0) {
        uint64_t p = (i - 1) / 2;
        if (h->t[p] <= h->t[i])
            break;
        swap_times(&h->t[p], &h->t[i]);
        i = p;
    }
}

uint64_t accel_sem_pop(accel_sem *h)
{
    uint64_t top = h->t[0], i = 0;
    h->t[0] = h->t[--h->n];
    for (;;) {
        uint64_t l = 2 * i + 1, r = l + 1, s = i;
        if (l < h->n && h->t[l] < h->t[s])
            s = l;
        if (r < h->n && h->t[r] < h->t[s])
            s = r;
        if (s == i)
            break;
        swap_times(&h->t[s], &h->t[i]);
        i = s;
    }
    return top;
}

void accel_sem_free(accel_sem *h)
{
    free(h->t);
    h->t = NULL;
}
