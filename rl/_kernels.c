/* The policy server's own CPU kernels for rl/decoder.py (fp32; AVX-512, else AVX2 with FMA: the same code
   for each, rl/_kernels_isa.h, the fastest set the CPU has chosen as the module loads, `use` to choose
   another): a prefill's causal attention and the elementwise steps of a layer (RMSNorm, the rotary
   embedding with the keys' and values' copy into the slots, SiLU times the up projection), each one pass.
   Python passes pointers and strides (in floats) as ints; a kernel returns False, computing nothing, where
   it does not apply (neither set, a size it does not take), and the caller runs torch's ops. The GIL is
   released while one computes, on `threads` threads of OpenMP: built with -fopenmp, this links libgomp.so.1, which is torch's own
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
   head together (96 rows against one block of keys), in register tiles, softmax online (flash
   attention's rescaling), and skips every block above the diagonal: 3.5-3.7 ms on AVX-512. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <immintrin.h>
#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#define BQ 32 /* query positions a work item takes (times the group's heads: its rows) */
#define BK 64 /* keys a block */
#define R 6   /* rows a register tile */

typedef struct {
    const float *q, *k, *v;
    float *out;
    long qs[3], kvs[3], os[3];
    int n, heads, kv, new_, t, dim, groups, rows;
    float scale;
    int blocks;       /* query blocks per (row, kv head) */
    atomic_int next;  /* the next work item */
} Job;

#define SMALL 32768 /* floats: below this an elementwise step runs on one thread (a decode step's rows) */

#define ISA 512
#include "_kernels_isa.h"
#undef ISA
#define ISA 256
#include "_kernels_isa.h"
#undef ISA

static int isa; /* the set the kernels run on: 512 (AVX-512), 256 (AVX2 with FMA), 0 (neither: torch's ops run);
                   a call reads it once (`use` may change it meanwhile, from another thread) */

static PyObject *causal(PyObject *self, PyObject *args) {
    unsigned long long q, k, v, out;
    Job j;
    int threads;
    if (!PyArg_ParseTuple(args, "K(lll)KK(lll)K(lll)iiiiiifi", &q, &j.qs[0], &j.qs[1], &j.qs[2], &k, &v, &j.kvs[0],
                          &j.kvs[1], &j.kvs[2], &out, &j.os[0], &j.os[1], &j.os[2], &j.n, &j.heads, &j.kv, &j.new_,
                          &j.t, &j.dim, &j.scale, &threads))
        return NULL;
    const int set = isa;
    if (!set || (j.dim != 64 && j.dim != 128) || j.kv <= 0 || j.heads % j.kv ||
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
    failed |= set == 512 ? worker_512(&j) : worker_256(&j);
    Py_END_ALLOW_THREADS
    if (failed) return PyErr_NoMemory();
    Py_RETURN_TRUE;
}

/* --- the elementwise steps of a layer, each one pass over its rows ------------------------------------ */

static int runs(int set) {
    return set == 512 ? __builtin_cpu_supports("avx512f") : set == 256 && __builtin_cpu_supports("avx2") &&
                                                                __builtin_cpu_supports("fma");
}

/* The set an elementwise step runs on over rows `width` floats wide: `set`, or AVX2 where the rows are whole
   vectors of 8 floats but not of AVX-512's 16 (heads of 16, 48, 80: every AVX-512 CPU has AVX2), else 0. */
static int set_for(int set, int width) {
    if (!set || width <= 0 || width % 8) return 0;
    return set == 256 || width % 16 == 0 ? set : runs(256) ? 256 : 0;
}

static PyObject *rms_norm(PyObject *self, PyObject *args) {
    unsigned long long x, w, out;
    long rows;
    int width, threads;
    float eps;
    if (!PyArg_ParseTuple(args, "KKKlifi", &x, &w, &out, &rows, &width, &eps, &threads)) return NULL;
    const int set = set_for(isa, width);
    if (!set) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    (set == 512 ? rms_rows_512 : rms_rows_256)((const float *)x, (const float *)w, (float *)out, rows, width, eps,
                                               threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

static PyObject *silu_mul(PyObject *self, PyObject *args) {
    unsigned long long g, out;
    long rows;
    int inner, threads;
    if (!PyArg_ParseTuple(args, "KKlii", &g, &out, &rows, &inner, &threads)) return NULL;
    const int set = set_for(isa, inner);
    if (!set) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    (set == 512 ? silu_rows_512 : silu_rows_256)((const float *)g, (float *)out, rows, inner, threads);
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
    const int set = dim % 2 ? 0 : set_for(isa, dim / 2);
    if (!set) Py_RETURN_FALSE;
    Py_BEGIN_ALLOW_THREADS
    (set == 512 ? rotate_rows_512 : rotate_rows_256)((float *)x, (const float *)cos, (const float *)sin, (float *)k,
                                                     (float *)v, ks, n, new_, heads, kv, dim, t, threads);
    Py_END_ALLOW_THREADS
    Py_RETURN_TRUE;
}

/* --- which set runs ---------------------------------------------------------------------------------- */

static const char *name_of(int set) { return set == 512 ? "avx512f" : set == 256 ? "avx2" : NULL; }

static PyObject *supported(PyObject *self, PyObject *args) {
    PyObject *out = PyList_New(0);
    for (int set = 512; out && set; set = set == 512 ? 256 : 0) {
        if (!runs(set)) continue;
        PyObject *name = PyUnicode_FromString(name_of(set));
        if (!name || PyList_Append(out, name) < 0) Py_CLEAR(out);
        Py_XDECREF(name);
    }
    return out;
}

static PyObject *use(PyObject *self, PyObject *args) {
    const char *name = NULL;
    if (!PyArg_ParseTuple(args, "z", &name)) return NULL;
    const int set = !name ? 0 : !strcmp(name, "avx512f") ? 512 : !strcmp(name, "avx2") ? 256 : -1;
    if (set < 0 || (set && !runs(set)))
        return PyErr_Format(PyExc_ValueError, "%s: not an instruction set this CPU runs the kernels on", name);
    const char *before = name_of(isa);
    isa = set;
    if (!before) Py_RETURN_NONE;
    return PyUnicode_FromString(before);
}

static PyObject *current(PyObject *self, PyObject *args) {
    if (!isa) Py_RETURN_NONE;
    return PyUnicode_FromString(name_of(isa));
}

static PyMethodDef methods[] = {
    {"causal", causal, METH_VARARGS, "Causal attention of a prefill (see the module's source)."},
    {"rms_norm", rms_norm, METH_VARARGS, "RMSNorm of contiguous rows."},
    {"silu_mul", silu_mul, METH_VARARGS, "silu(first half) * second half of contiguous rows."},
    {"rotate", rotate, METH_VARARGS, "The rotary embedding of q and k, in place, and k, v into the slots."},
    {"supported", supported, METH_NOARGS, "The instruction sets this CPU runs the kernels on, the fastest first."},
    {"use", use, METH_VARARGS, "Run the kernels on this set ('avx512f', 'avx2'; None: decline, torch's ops run); "
                               "returns the one before."},
    {"isa", current, METH_NOARGS, "The set the kernels run on (None: they decline)."},
    {NULL, NULL, 0, NULL}};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_kernels", NULL, -1, methods};

PyMODINIT_FUNC PyInit__kernels(void) {
    isa = runs(512) ? 512 : runs(256) ? 256 : 0; /* the fastest this CPU has */
    return PyModule_Create(&module);
}
