/* rl/_kernels.c's kernels for one instruction set, included once per set: with ISA 512, AVX-512 (vectors of
   16 floats, 32 registers: a register tile of 6 rows x 64 columns); with ISA 256, AVX2 with FMA (vectors of
   8, 16 registers: a tile of 6 rows x 16 columns, the 12 sums, 2 loads and a broadcast). Every function
   here is suffixed by its set (NAME). */

#if ISA == 512
#define TARGET __attribute__((target("avx512f")))
#define NAME(f) f##_512
#define W 16
#define C 4 /* vectors a tile's row */
#define vf __m512
#define vload _mm512_loadu_ps
#define vstore _mm512_storeu_ps
#define vset1 _mm512_set1_ps
#define vzero _mm512_setzero_ps
#define vadd _mm512_add_ps
#define vsub _mm512_sub_ps
#define vmul _mm512_mul_ps
#define vdiv _mm512_div_ps
#define vmax _mm512_max_ps
#define vmin _mm512_min_ps
#define vfmadd _mm512_fmadd_ps
#define vfmsub _mm512_fmsub_ps
#define vfnmadd _mm512_fnmadd_ps
#define vhmax _mm512_reduce_max_ps
#define vhadd _mm512_reduce_add_ps
#elif ISA == 256
#define TARGET __attribute__((target("avx2,fma")))
#define NAME(f) f##_256
#define W 8
#define C 2
#define vf __m256
#define vload _mm256_loadu_ps
#define vstore _mm256_storeu_ps
#define vset1 _mm256_set1_ps
#define vzero _mm256_setzero_ps
#define vadd _mm256_add_ps
#define vsub _mm256_sub_ps
#define vmul _mm256_mul_ps
#define vdiv _mm256_div_ps
#define vmax _mm256_max_ps
#define vmin _mm256_min_ps
#define vfmadd _mm256_fmadd_ps
#define vfmsub _mm256_fmsub_ps
#define vfnmadd _mm256_fnmadd_ps
#define vhmax hmax_256
#define vhadd hadd_256

static inline TARGET float hmax_256(__m256 v) {
    __m128 x = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_max_ss(x, _mm_shuffle_ps(x, x, 1)));
}

static inline TARGET float hadd_256(__m256 v) {
    __m128 x = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    return _mm_cvtss_f32(_mm_add_ss(x, _mm_shuffle_ps(x, x, 1)));
}
#endif

/* exp(x) for x <= 88: Cephes' polynomial on the reduced argument, scaled by 2^n. Below the smallest normal
   float it is 0 or a denormal, so a masked -inf gives exactly 0. ~1 ulp. */
static inline TARGET vf NAME(vexp)(vf x) {
#if ISA == 512
    x = vmax(x, vset1(-127.0f));
    vf n = _mm512_roundscale_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT);
#else
    const vf normal = _mm256_cmp_ps(x, vset1(-87.33f), _CMP_GE_OQ); /* 2^n a normal float: n >= -126 */
    x = vmax(x, vset1(-87.33f));
    vf n = _mm256_round_ps(vmul(x, vset1(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
#endif
    vf f = vfnmadd(n, vset1(0.693359375f), x);
    f = vfnmadd(n, vset1(-2.12194440e-4f), f);
    vf p = vset1(1.9875691500e-4f);
    p = vfmadd(p, f, vset1(1.3981999507e-3f));
    p = vfmadd(p, f, vset1(8.3334519073e-3f));
    p = vfmadd(p, f, vset1(4.1665795894e-2f));
    p = vfmadd(p, f, vset1(1.6666665459e-1f));
    p = vfmadd(p, f, vset1(5.0000001201e-1f));
    p = vfmadd(p, vmul(f, f), vadd(f, vset1(1.0f)));
#if ISA == 512
    return _mm512_scalef_ps(p, n);
#else
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_and_ps(vmul(p, _mm256_castsi256_ps(e)), normal);
#endif
}

/* One register tile, R rows x C vectors: acc[x] += sum over j < n of a[x * as + j] * b[j * bs : j * bs + C * W]. */
static inline __attribute__((always_inline)) TARGET void NAME(tile)(vf acc[R][C], const float *a, long as,
                                                                     const float *b, long bs, int n) {
    for (int j = 0; j < n; j++) {
        const float *bj = b + j * bs;
        vf bv[C];
        for (int c = 0; c < C; c++) bv[c] = vload(bj + W * c);
        for (int x = 0; x < R; x++) {
            vf w = vset1(a[x * as + j]);
            for (int c = 0; c < C; c++) acc[x][c] = vfmadd(w, bv[c], acc[x][c]);
        }
    }
}

/* s[rows][BK] = qs[rows][D] . kt[D][BK] */
static inline TARGET void NAME(scores)(const float *qs, const float *kt, float *s, int rows, int D) {
    for (int r = 0; r < rows; r += R)
        for (int c0 = 0; c0 < BK; c0 += C * W) {
            vf acc[R][C];
            for (int x = 0; x < R; x++)
                for (int c = 0; c < C; c++) acc[x][c] = vzero();
            NAME(tile)(acc, qs + r * D, D, kt + c0, BK, D);
            for (int x = 0; x < R; x++)
                for (int c = 0; c < C; c++) vstore(s + (r + x) * BK + c0 + W * c, acc[x][c]);
        }
}

/* o[rows][D] = o * alpha[row] + p[rows][BK] . v[keys][D] (v rows `vs` floats apart) */
static inline TARGET void NAME(accumulate)(float *o, const float *alpha, const float *p, const float *v, long vs,
                                           int keys, int rows, int D) {
    for (int r = 0; r < rows; r += R) {
        for (int c0 = 0; c0 < D; c0 += C * W) {
            vf acc[R][C];
            for (int x = 0; x < R; x++) {
                vf a = vset1(alpha[r + x]);
                for (int c = 0; c < C; c++) acc[x][c] = vmul(vload(o + (r + x) * D + c0 + W * c), a);
            }
            NAME(tile)(acc, p + r * BK, BK, v + c0, vs, keys);
            for (int x = 0; x < R; x++)
                for (int c = 0; c < C; c++) vstore(o + (r + x) * D + c0 + W * c, acc[x][c]);
        }
    }
}

/* One work item: query positions i0..i0+BQ-1 of the `groups` heads of kv head g in row b. */
static TARGET void NAME(item)(const Job *j, int b, int g, int i0, float *qs, float *kt, float *s, float *o, float *m,
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
        NAME(scores)(qs, kt, s, rows, D);
        const int masked = j0 + BK - 1 > j->t + i0; /* a key of the block is after some query */
        for (int r = 0; r < rows; r++) {
            float *sr = s + r * BK;
            if (masked) {
                const int see = j->t + i0 + r % BQ - j0 + 1; /* keys of the block this row sees */
                for (int jj = see < 0 ? 0 : see; jj < BK; jj++) sr[jj] = -INFINITY;
            }
            vf mx = vload(sr);
            for (int c = W; c < BK; c += W) mx = vmax(mx, vload(sr + c));
            float top = vhmax(mx);
            float mn = top > m[r] ? top : m[r];
            alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn);
            m[r] = mn;
            vf base = vset1(mn == -INFINITY ? 0.0f : mn), sum = vzero();
            for (int c = 0; c < BK; c += W) {
                vf e = NAME(vexp)(vsub(vload(sr + c), base));
                vstore(sr + c, e);
                sum = vadd(sum, e);
            }
            l[r] = l[r] * alpha[r] + vhadd(sum);
        }
        NAME(accumulate)(o, alpha, s, vb + j0 * ks, ks, keys, rows, D);
    }
    for (int h = 0; h < G; h++)
        for (int i = 0; i < qn; i++) {
            const int r = h * BQ + i;
            float *dst = j->out + b * j->os[0] + (g * G + h) * j->os[1] + (i0 + i) * j->os[2];
            const float inv = 1.0f / l[r];
            for (int d = 0; d < D; d++) dst[d] = o[r * D + d] * inv;
        }
}

static int NAME(worker)(Job *j) { /* 1 where it found no memory */
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
        NAME(item)(j, rest / j->kv, rest % j->kv, qb * BQ, qs, kt, s, o, m, l, alpha);
    }
    free(buf);
    return 0;
}

/* out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * w, rows of `width` floats (a multiple of W) */
static TARGET void NAME(rms_rows)(const float *x, const float *w, float *out, long rows, int width, float eps,
                                  int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * width >= SMALL && threads > 1)
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * width;
        vf acc = vzero();
        for (int c = 0; c < width; c += W) {
            vf v = vload(xr + c);
            acc = vfmadd(v, v, acc);
        }
        const vf inv = vset1(1.0f / sqrtf(vhadd(acc) / width + eps));
        for (int c = 0; c < width; c += W) vstore(out + r * width + c, vmul(vmul(vload(xr + c), inv), vload(w + c)));
    }
}

/* out[r] = silu(g[r][:inner]) * g[r][inner:], g rows of 2 * inner floats (inner a multiple of W) */
static TARGET void NAME(silu_rows)(const float *g, float *out, long rows, int inner, int threads) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows * inner >= SMALL && threads > 1)
    for (long r = 0; r < rows; r++) {
        const float *a = g + r * 2 * inner, *b = a + inner;
        for (int c = 0; c < inner; c += W) {
            vf x = vload(a + c);
            vf e = NAME(vexp)(vmin(vsub(vzero(), x), vset1(88.0f)));
            vf silu = vdiv(x, vadd(vset1(1.0f), e));
            vstore(out + r * inner + c, vmul(silu, vload(b + c)));
        }
    }
}

/* x [n, new, heads + 2 kv, dim] (contiguous) as the q/k/v projection wrote it: the query and key heads
   turned in place by the rotary embedding (cos, sin [n, new, dim]: x * cos + rotate_half(x) * sin), and
   the keys and values copied to columns t.. of the slots k, v [rows, kv, columns, dim] (`ks` strides). */
static TARGET void NAME(rotate_rows)(float *x, const float *cos, const float *sin, float *k, float *v, const long *ks,
                                     int n, int new_, int heads, int kv, int dim, int t, int threads) {
    const int width = heads + 2 * kv, half = dim / 2;
#pragma omp parallel for num_threads(threads) schedule(static) if ((long)n * new_ * width * dim >= SMALL && threads > 1)
    for (long row = 0; row < (long)n * new_; row++) {
        const long b = row / new_, i = row % new_;
        const float *c = cos + row * dim, *s = sin + row * dim;
        float *xr = x + row * width * dim;
        for (int h = 0; h < heads + kv; h++) {
            float *y = xr + h * dim;
            for (int d = 0; d < half; d += W) {
                vf lo = vload(y + d), hi = vload(y + half + d);
                vf nlo = vfmsub(lo, vload(c + d), vmul(hi, vload(s + d)));
                vf nhi = vfmadd(hi, vload(c + half + d), vmul(lo, vload(s + half + d)));
                vstore(y + d, nlo);
                vstore(y + half + d, nhi);
            }
        }
        for (int g = 0; g < kv; g++) {
            const long at = b * ks[0] + g * ks[1] + (t + i) * ks[2];
            memcpy(k + at, xr + (heads + g) * dim, sizeof(float) * dim);
            memcpy(v + at, xr + (heads + kv + g) * dim, sizeof(float) * dim);
        }
    }
}

#undef TARGET
#undef NAME
#undef W
#undef C
#undef vf
#undef vload
#undef vstore
#undef vset1
#undef vzero
#undef vadd
#undef vsub
#undef vmul
#undef vdiv
#undef vmax
#undef vmin
#undef vfmadd
#undef vfmsub
#undef vfnmadd
#undef vhmax
#undef vhadd
