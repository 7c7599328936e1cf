/* The policy server's own CPU kernels for rl/decoder.py (fp32, AVX-512): a prefill's causal attention
   and the elementwise steps of a layer (RMSNorm, the rotary embedding with the keys' and values' copy
   into the slots, SiLU times the up projection), each one pass. Python passes pointers and strides (in
   floats) as ints; a kernel returns False, computing nothing, where it does not apply (no AVX-512, a
   size it does not take), and the caller runs torch's ops. The GIL is released while one computes,
   on `threads` threads of OpenMP: built with -fopenmp, this links libgomp.so.1, which is torch's own
   once torch is loaded, so its threads are the ones torch's matmuls use. Threads of its own
   (pthreads) had cost 4 ms a layer more: torch's idle OpenMP threads spin for a while after each op,
   and took the cores from them.

   causal(q, q_strides, k, v, kv_strides, out, out_strides, n, heads, kv_heads, new, t, dim, scale, threads):
   queries q [n, heads, new, dim] at columns t..t+new-1 each attend to the keys k and values v
   [n, kv_heads, t + new, dim] at columns 0..their own (a prompt's cached head whole, its new tokens
   causally); out [n, heads, new, dim]; heads of 64 or 128. torch's CPU flash kernel took 9.4 ms a
   layer for SmolLM2's 1k-token prompt (9 heads over 3 key/value heads of 64) on 2 cores: it computes
   ~3/4 of the full square (its blocks above the diagonal are 512 keys wide) and each query head reads
   its keys again. This one computes blocks of 32 queries x 64 keys, the query heads of a key/value
   head together (96 rows against one block of keys), in AVX-512 register tiles, softmax online (flash
   attention's rescaling), and skips every block above the diagonal: 3.5-3.7 ms. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BQ 32 /* query positions a work item takes (times the group's heads: its rows) */
#define BK 64 /* keys a block: four vectors of 16 */
#define R 6   /* rows a register tile: 6 x 4 accumulators */

typedef struct {
    const float *q, *k, *v;
    float *out;
    long qs[3], kvs[3], os[3];
    int n, heads, kv, new_, t, dim, groups, rows;
    float scale;
    int blocks;       /* query blocks per (row, kv head) */
    atomic_int next;  /* the next work item */
} Job;

#define TARGET __attribute__((target("avx512f")))

/* exp(x) for x <= 88: Cephes' polynomial on the reduced argument, scaled by 2^n (scalef: 0 below the
   smallest float, so a masked -inf gives exactly 0). ~1 ulp. */
static inline TARGET __m512 exp512(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-127.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
    __m512 f = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    f = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), f);
    __m512 p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_fmadd_ps(p, _mm512_mul_ps(f, f), _mm512_add_ps(f, _mm512_set1_ps(1.0f)));
    return _mm512_scalef_ps(p, n);
}

/* One 6 x 64 register tile: acc[x] += sum over j < n of a[x * as + j] * b[j * bs : j * bs + 64]. */
static inline __attribute__((always_inline)) TARGET void tile(__m512 acc[R][4], const float *a, long as, const float *b,
                                                               long bs, int n) {
    for (int j = 0; j < n; j++) {
        const float *bj = b + j * bs;
        __m512 b0 = _mm512_loadu_ps(bj), b1 = _mm512_loadu_ps(bj + 16), b2 = _mm512_loadu_ps(bj + 32),
               b3 = _mm512_loadu_ps(bj + 48);
        for (int x = 0; x < R; x++) {
            __m512 w = _mm512_set1_ps(a[x * as + j]);
            acc[x][0] = _mm512_fmadd_ps(w, b0, acc[x][0]);
            acc[x][1] = _mm512_fmadd_ps(w, b1, acc[x][1]);
            acc[x][2] = _mm512_fmadd_ps(w, b2, acc[x][2]);
            acc[x][3] = _mm512_fmadd_ps(w, b3, acc[x][3]);
        }
    }
}

/* s[rows][BK] = qs[rows][D] . kt[D][BK] */
static inline TARGET void scores(const float *qs, const float *kt, float *s, int rows, int D) {
    for (int r = 0; r < rows; r += R) {
        __m512 acc[R][4];
        for (int x = 0; x < R; x++)
            for (int c = 0; c < 4; c++) acc[x][c] = _mm512_setzero_ps();
        tile(acc, qs + r * D, D, kt, BK, D);
        for (int x = 0; x < R; x++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(s + (r + x) * BK + 16 * c, acc[x][c]);
    }
}

/* o[rows][D] = o * alpha[row] + p[rows][BK] . v[keys][D] (v rows `vs` floats apart) */
static inline TARGET void accumulate(float *o, const float *alpha, const float *p, const float *v, long vs, int keys,
                                     int rows, int D) {
    for (int r = 0; r < rows; r += R) {
        for (int c0 = 0; c0 < D; c0 += 64) {
            __m512 acc[R][4];
            for (int x = 0; x < R; x++) {
                __m512 a = _mm512_set1_ps(alpha[r + x]);
                for (int c = 0; c < 4; c++) acc[x][c] = _mm512_mul_ps(_mm512_loadu_ps(o + (r + x) * D + c0 + 16 * c), a);
            }
            tile(acc, p + r * BK, BK, v + c0, vs, keys);
            for (int x = 0; x < R; x++)
                for (int c = 0; c < 4; c++) _mm512_storeu_ps(o + (r + x) * D + c0 + 16 * c, acc[x][c]);
        }
    }
}

/* One work item: query positions i0..i0+BQ-1 of the `groups` heads of kv head g in row b. */
static TARGET void item(const Job *j, int b, int g, int i0, float *qs, float *kt, float *s, float *o, float *m,
                        float *l, float *alpha) {
    const int D = j->dim, G = j->groups, rows = j->rows;
    const int qn = j->new_ - i0 < BQ ? j->new_ - i0 : BQ;
    memset(qs, 0, sizeof(float) * rows * D);
    for (int h = 0; h < G; h++)
        for (int i = 0; i < qn; i++) {
            const float *src = j->q + b * j->qs[0] + (g * G + h) * j->qs[1] + (i0 + i) * j->qs[2];
            float *dst = qs + (h * BQ + i) * D;
            for (int d = 0; d < D; d++) dst[d] = src[d] * j->scale;
        }
    memset(o, 0, sizeof(float) * rows * D);
    for (int r = 0; r < rows; r++) m[r] = -INFINITY, l[r] = 0.0f;
    const float *kb = j->k + b * j->kvs[0] + g * j->kvs[1], *vb = j->v + b * j->kvs[0] + g * j->kvs[1];
    const long ks = j->kvs[2];
    const int last = j->t + i0 + qn; /* keys 0..last-1 are seen by some query of the item */
    for (int j0 = 0; j0 < last; j0 += BK) {
        const int keys = last - j0 < BK ? last - j0 : BK;
        for (int jj = 0; jj < BK; jj++)
            for (int d = 0; d < D; d++) kt[d * BK + jj] = jj < keys ? kb[(j0 + jj) * ks + d] : 0.0f;
        scores(qs, kt, s, rows, D);
        const int masked = j0 + BK - 1 > j->t + i0; /* a key of the block is after some query */
        for (int r = 0; r < rows; r++) {
            float *sr = s + r * BK;
            if (masked) {
                const int see = j->t + i0 + r % BQ - j0 + 1; /* keys of the block this row sees */
                for (int jj = see < 0 ? 0 : see; jj < BK; jj++) sr[jj] = -INFINITY;
            }
            __m512 mx = _mm512_max_ps(_mm512_max_ps(_mm512_loadu_ps(sr), _mm512_loadu_ps(sr + 16)),
                                      _mm512_max_ps(_mm512_loadu_ps(sr + 32), _mm512_loadu_ps(sr + 48)));
            float top = _mm512_reduce_max_ps(mx);
            float mn = top > m[r] ? top : m[r];
            alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            m[r] = mn;
            __m512 base = _mm512_set1_ps(mn == -INFINITY ? 0.0f : mn), sum = _mm512_setzero_ps();
            for (int c = 0; c < 4; c++) {
                __m512 e = exp512(_mm512_sub_ps(_mm512_loadu_ps(sr + 16 * c), base));
                _mm512_storeu_ps(sr + 16 * c, e);
                sum = _mm512_add_ps(sum, e);
            }
            l[r] = l[r] * alpha[r] + _mm512_reduce_add_ps(sum);
        }
        accumulate(o, alpha, s, vb + j0 * ks, ks, keys, rows, D);
    }
    for (int h = 0; h < G; h++)
        for (int i = 0; i < qn; i++) {
            const int r = h * BQ + i;
            float *dst = j->out + b * j->os[0] + (g * G + h) * j->os[1] + (i0 + i) * j->os[2];
            const float inv = 1.0f / l[r];
            for (int d = 0; d < D; d++) dst[d] = o[r * D + d] * inv;
        }
}

static int worker(Job *j) { /* 1 where it found no memory */
    const int D = j->dim, rows = j->rows;
    size_t floats = (size_t)rows * D * 2 + (size_t)D * BK + (size_t)rows * BK + 3 * (size_t)rows;
    float *buf = aligned_alloc(64, (floats * sizeof(float) + 63) / 64 * 64);
    if (!buf) return 1;
    float *qs = buf, *o = qs + rows * D, *kt = o + rows * D, *s = kt + D * BK, *m = s + rows * BK, *l = m + rows,
          *alpha = l + rows;
    const int per = j->kv * j->blocks, total = j->n * per;
    for (int w; (w = atomic_fetch_add(&j->next, 1)) < total;) {
        /* the costliest first (the last query blocks see the most keys), so that threads end together */
        const int qb = j->blocks - 1 - w / (j->n * j->kv), rest = w % (j->n * j->kv);
        item(j, rest / j->kv, rest % j->kv, qb * BQ, qs, kt, s, o, m, l, alpha);
    }
    free(buf);
    return 0;
}

static PyObject *causal(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, out;
    Job j;
    int threads;
    if (!PyArg_ParseTuple(args, "K(lll)KK(lll)K(lll)iiiiiifi", &q, &j.qs[0], &j.qs[1], &j.qs[2], &k, &v, &j.kvs[0],
                          &j.kvs[1], &j.kvs[2], &out, &j.os[0], &j.os[1], &j.os[2], &j.n, &j.heads, &j.kv, &j.new_,
                          &j.t, &j.dim, &j.scale, &threads))
        return NULL;
    if (!__builtin_cpu_supports("avx512f") || (j.dim != 64 && j.dim != 128) || j.kv <= 0 || j.heads % j.kv ||
        j.new_ <= 0 || j.n <= 0)
        Py_RETURN_FALSE;
    j.q = (const float *)q, j.k = (const float *)k, j.v = (const float *)v, j.out = (float *)out;
    j.groups = j.heads / j.kv;
    j.rows = (j.groups * BQ + R - 1) / R * R;
    j.blocks = (j.new_ + BQ - 1) / BQ;
    atomic_init(&j.next, 0);
    if (threads < 1) threads = 1;
    if (threads > j.n * j.kv * j.blocks) threads = j.n * j.kv * j.blocks;
    int failed = 0;
    Py_BEGIN_ALLOW_THREADS
#pragma omp parallel num_threads(threads) reduction(| : failed)
    failed |= worker(&j);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* --- the elementwise steps of a layer, each one pass over its rows ------------------------------------ */

#define SMALL 32768 /* floats: below this a step runs on one thread (a decode step's rows) */

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of `width` floats (a multiple of 16) */
static TARGET void rms_rows(const float *x, const float *w, float *out, long rows, int width, float eps, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= SMALL && threads > 1)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        __m512 acc = _mm512_setzero_ps();
        for (int c = 0; c < width; c += 16) {
            __m512 v = _mm512_loadu_ps(xr + c);
            acc = _mm512_fmadd_ps(v, v, acc);
        }
        const __m512 inv = _mm512_set1_ps(1.0f / sqrtf(_mm512_reduce_add_ps(acc) / width + eps));
        for (int c = 0; c < width; c += 16)
            _mm512_storeu_ps(out + r * width + c,
                             _mm512_mul_ps(_mm512_mul_ps(_mm512_loadu_ps(xr + c), inv), _mm512_loadu_ps(w + c)));
    }
}

/* out[r] = silu(g[r][:inner]) * g[r][inner:], g rows of 2 * inner floats (inner a multiple of 16) */
static TARGET void silu_rows(const float *g, float *out, long rows, int inner, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * inner >= SMALL && threads > 1)
    for (long r = 0; r < rows; r++) {
        const float *a = g + r * 2 * inner, *b = a + inner;
        for (int c = 0; c < inner; c += 16) {
            __m512 x = _mm512_loadu_ps(a + c);
            __m512 e = exp512(_mm512_min_ps(_mm512_sub_ps(_mm512_setzero_ps(), x), _mm512_set1_ps(88.0f)));
            __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
            _mm512_storeu_ps(out + r * inner + c, _mm512_mul_ps(silu, _mm512_loadu_ps(b + c)));
        }
    }
}

/* x [n, new, heads + 2 kv, dim] (contiguous) as the q/k/v projection wrote it: the query and key heads
   turned in place by the rotary embedding (cos, sin [n, new, dim]: x * cos + rotate_half(x) * sin), and
   the keys and values copied to columns t.. of the slots k, v [rows, kv, columns, dim] (`ks` strides). */
static TARGET void rotate_rows(float *x, const float *cos, const float *sin, float *k, float *v, const long *ks,
                               int n, int new_, int heads, int kv, int dim, int t, int threads) {
    const int width = heads + 2 * kv, half = dim / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if ((long)n * new_ * width * dim >= SMALL && threads > 1)
    for (long row = 0; row < (long)n * new_; row++) {
        const long b = row / new_, i = row % new_;
        const float *c = cos + row * dim, *s = sin + row * dim;
        float *xr = x + row * width * dim;
        for (int h = 0; h < heads + kv; h++) {
            float *y = xr + h * dim;
            for (int d = 0; d < half; d += 16) {
                __m512 lo = _mm512_loadu_ps(y + d), hi = _mm512_loadu_ps(y + half + d);
                __m512 nlo = _mm512_fmsub_ps(lo, _mm512_loadu_ps(c + d), _mm512_mul_ps(hi, _mm512_loadu_ps(s + d)));
                __m512 nhi = _mm512_fmadd_ps(hi, _mm512_loadu_ps(c + half + d), _mm512_mul_ps(lo, _mm512_loadu_ps(s + half + d)));
                _mm512_storeu_ps(y + d, nlo);
                _mm512_storeu_ps(y + half + d, nhi);
            }
        }
        for (int g = 0; g < kv; g++) {
            const long at = b * ks[0] + g * ks[1] + (t + i) * ks[2];
            memcpy(k + at, xr + (heads + g) * dim, sizeof(float) * dim);
            memcpy(v + at, xr + (heads + kv + g) * dim, sizeof(float) * dim);
        }
    }
}

static int usable(int width) { return __builtin_cpu_supports("avx512f") && width > 0 && width % 16 == 0; }

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, w, out;
    long rows;
    int width, threads;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKlifi", &x, &w, &out, &rows, &width, &eps, &threads)) return NULL;
    if (!usable(width)) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    rms_rows((const float *)x, (const float *)w, (float *)out, rows, width, eps, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

static PyObject *silu_mul(PyObject *self, PyObject *args) {
    unsigned long long g, out;
    long rows;
    int inner, threads;
    if (!PyArg_ParseTuple(args, "KKlii", &g, &out, &rows, &inner, &threads)) return NULL;
    if (!usable(inner)) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    silu_rows((const float *)g, (float *)out, rows, inner, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

static PyObject *rotate(PyObject *self, PyObject *args) {
    unsigned long long x, cos, sin, k, v;
    long ks[3];
    int n, new_, heads, kv, dim, t, threads;
    if (!PyArg_ParseTuple(args, "KKKKK(lll)iiiiiii", &x, &cos, &sin, &k, &v, &ks[0], &ks[1], &ks[2], &n, &new_, &heads,
                          &kv, &dim, &t, &threads))
        return NULL;
    if (!usable(dim / 2) || dim % 2) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    rotate_rows((float *)x, (const float *)cos, (const float *)sin, (float *)k, (float *)v, ks, n, new_, heads, kv, dim,
                t, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

static PyMethodDef methods[] = {
    {"causal", causal, METH_VARARGS, "Causal attention of a prefill (see the module's source)."},
    {"rms_norm", rms_norm, METH_VARARGS, "RMSNorm of contiguous rows."},
    {"silu_mul", silu_mul, METH_VARARGS, "silu(first half) * second half of contiguous rows."},
    {"rotate", rotate, METH_VARARGS, "The rotary embedding of q and k, in place, and k, v into the slots."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) { return PyModule_Create(&module); }
