/* The kernels' single-row steps and their work-shared loops, for the batch-1 decode step
 * (decode_step.c), which runs every layer inside one OpenMP parallel region.
 *
 * Each kvgate_* entry point torch's side calls opens a parallel region of its own; the
 * functions here are what those entry points run, split out so that decode_step.c runs the
 * same code, and so rounds exactly as they do. The *_team functions hold orphaned `omp for`
 * loops: called inside a parallel region, the team shares their work and meets at their
 * ends; called outside one, the calling thread does it all.
 */
#ifndef KVGATE_TEAM_H
#define KVGATE_TEAM_H

#include <stdint.h>

/* y = x @ w.T for x [m, k], w [n, k] (y [m, n]); with `accumulate`, y += x @ w.T */
void kvgate_rowdot_team(const float *w, const float *x, float *y, int64_t m, int64_t n,
                        int64_t k, int accumulate);

/* y = x * rsqrt(mean(x^2) + eps) * w over one row of n */
void kvgate_rms_norm_row(const float *x, const float *w, float *y, int64_t n, float eps);

/* the rotary embedding of the first `heads` heads of d floats of one row x, in place */
void kvgate_rope_row(float *x, const float *c, const float *s, int64_t heads, int64_t d);

/* y = silu(g) * u over n */
void kvgate_swiglu_row(const float *g, const float *u, float *y, int64_t n);

/* whether decode attention takes this shape (heads of at most MAX_D floats, at most
 * MAX_HEADS query heads) */
int kvgate_attention_takes(int64_t kv_heads, int64_t g, int64_t d);

/* keys per piece of decode attention */
int64_t kvgate_attention_block(void);

/* decode attention's pieces and their merge (see kvgate_decode_attention): lens already
 * checked to be 1 .. ld_slots, `pieces` = ceil(max(lens) / kvgate_attention_block()) */
void kvgate_attention_team(const float *q, int64_t ld_q, const void *pool, int half,
                           int64_t stride, const int64_t *slots, int64_t ld_slots,
                           const int64_t *lens, float *out, float *scratch, int64_t rows,
                           int64_t kv_heads, int64_t g, int64_t d, float scale, int64_t pieces);

#endif
