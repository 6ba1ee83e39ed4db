// Test data of the NCCL runner, made and checked on the GPU (see gpu.rs).
//
// A rank's input, and every segment of its expected output, is one pattern of PERIOD
// elements repeated (check.rs says why that is enough), so the kernels see bytes, not
// types: `heddle_fill` writes the pattern, `heddle_count_exact` counts the elements that
// differ from it bit for bit. Only the average of floating types is compared with a
// tolerance (`heddle_count_close_*`), because NCCL may divide before or after summing.
// Only the count of wrong elements goes back to the host.
//
// Built into kernels.ptx, which the agent embeds and the driver compiles when the module
// is loaded; no compiler is needed on the build machine or the node:
//
//   nvcc -ptx -arch=compute_75 -O3 -o kernels.ptx kernels.cu
//   sed -i 's/^\.version .*/.version 7.0/' kernels.ptx   # loads on drivers from CUDA 11.0
//
// then check that `ptxas -arch=sm_75` and `-arch=sm_90` still accept it.

#define PERIOD 14
#define MAX_PATTERN (PERIOD * 8)

struct Pattern {
    unsigned char bytes[128]; // one period of the pattern, `len` bytes used
    unsigned int len;         // PERIOD x element size
    unsigned int elem;        // element size in bytes: 1, 2, 4 or 8
};

struct Expect {
    double value[16]; // the expected value at each residue of the element index, PERIOD used
    double tol;       // relative tolerance
};

// vec[q] = the 16 bytes of the pattern starting at byte q of a period.
__device__ void build_table(uint4 *vec, const Pattern &p) {
    for (unsigned int q = threadIdx.x; q < p.len; q += blockDim.x) {
        unsigned int w[4];
        for (int k = 0; k < 4; k++) {
            unsigned int v = 0;
            for (int b = 0; b < 4; b++) {
                v |= (unsigned int)p.bytes[(q + 4 * k + b) % p.len] << (8 * b);
            }
            w[k] = v;
        }
        vec[q] = make_uint4(w[0], w[1], w[2], w[3]);
    }
}

// Bytes before the first 16-byte boundary of `buf` (at most n).
__device__ unsigned long long head_bytes(const void *buf, unsigned long long n) {
    unsigned long long h = (16 - ((unsigned long long)buf & 15)) & 15;
    return h < n ? h : n;
}

// Writes the pattern over n bytes of buf; byte j gets pattern byte (phase + j) % len.
extern "C" __global__ void heddle_fill(unsigned char *buf, unsigned long long n,
                                       unsigned int phase, Pattern p) {
    __shared__ uint4 vec[MAX_PATTERN];
    build_table(vec, p);
    __syncthreads();
    const unsigned long long head = head_bytes(buf, n);
    const unsigned long long chunks = (n - head) / 16;
    uint4 *body = (uint4 *)(buf + head);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int q = (unsigned int)((phase + head + 16 * i) % p.len);
    const unsigned int step = (unsigned int)((16 * stride) % p.len);
    for (; i < chunks; i += stride) {
        body[i] = vec[q];
        q += step;
        if (q >= p.len) q -= p.len;
    }
    if (blockIdx.x == 0) {
        const unsigned long long tail = head + 16 * chunks;
        for (unsigned long long j = threadIdx.x; j < head; j += blockDim.x) {
            buf[j] = p.bytes[(phase + j) % p.len];
        }
        for (unsigned long long j = tail + threadIdx.x; j < n; j += blockDim.x) {
            buf[j] = p.bytes[(phase + j) % p.len];
        }
    }
}

// Elements of `elem` bytes in a 16-byte xor that are not zero.
__device__ unsigned int nonzero_elems(uint4 x, unsigned int elem) {
    unsigned int w[4] = {x.x, x.y, x.z, x.w};
    unsigned int n = 0;
    switch (elem) {
    case 8:
        n = ((w[0] | w[1]) != 0) + ((w[2] | w[3]) != 0);
        break;
    case 4:
        n = (w[0] != 0) + (w[1] != 0) + (w[2] != 0) + (w[3] != 0);
        break;
    case 2:
        for (int k = 0; k < 4; k++) {
            n += ((w[k] & 0xffffu) != 0) + ((w[k] >> 16) != 0);
        }
        break;
    default:
        for (int k = 0; k < 4; k++) {
            // High bit of each byte set where the byte is not zero.
            unsigned int t = ((w[k] & 0x7f7f7f7fu) + 0x7f7f7f7fu) | w[k];
            n += __popc(t & 0x80808080u);
        }
        break;
    }
    return n;
}

__device__ void add_count(unsigned long long *wrong, unsigned long long mine) {
    for (int off = 16; off > 0; off /= 2) {
        mine += __shfl_down_sync(0xffffffffu, mine, off);
    }
    if ((threadIdx.x & 31) == 0 && mine != 0) atomicAdd(wrong, mine);
}

// Adds to *wrong the elements of n bytes of buf that differ from the pattern. buf and n
// are whole elements, and buf is aligned to the element size.
extern "C" __global__ void heddle_count_exact(const unsigned char *buf, unsigned long long n,
                                              unsigned int phase, Pattern p,
                                              unsigned long long *wrong) {
    __shared__ uint4 vec[MAX_PATTERN];
    build_table(vec, p);
    __syncthreads();
    const unsigned long long head = head_bytes(buf, n);
    const unsigned long long chunks = (n - head) / 16;
    const uint4 *body = (const uint4 *)(buf + head);
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long i = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int q = (unsigned int)((phase + head + 16 * i) % p.len);
    const unsigned int step = (unsigned int)((16 * stride) % p.len);
    unsigned long long mine = 0;
    for (; i < chunks; i += stride) {
        uint4 g = body[i];
        uint4 w = vec[q];
        uint4 x = make_uint4(g.x ^ w.x, g.y ^ w.y, g.z ^ w.z, g.w ^ w.w);
        mine += nonzero_elems(x, p.elem);
        q += step;
        if (q >= p.len) q -= p.len;
    }
    if (blockIdx.x == 0) {
        const unsigned long long tail = head + 16 * chunks;
        for (unsigned long long e = threadIdx.x * p.elem; e < head; e += blockDim.x * p.elem) {
            bool bad = false;
            for (unsigned int b = 0; b < p.elem; b++) {
                bad |= buf[e + b] != p.bytes[(phase + e + b) % p.len];
            }
            mine += bad;
        }
        for (unsigned long long e = tail + threadIdx.x * p.elem; e < n; e += blockDim.x * p.elem) {
            bool bad = false;
            for (unsigned int b = 0; b < p.elem; b++) {
                bad |= buf[e + b] != p.bytes[(phase + e + b) % p.len];
            }
            mine += bad;
        }
    }
    add_count(wrong, mine);
}

__device__ double decode(unsigned short h, int kind) {
    if (kind == 0) {
        float f;
        asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
        return f;
    }
    return __uint_as_float((unsigned int)h << 16); // bfloat16: the high half of a float
}

__device__ double decode(float f, int) { return f; }
__device__ double decode(double d, int) { return d; }

// Adds to *wrong the elements of buf[0..n) that are not within e.tol (relative, at least
// absolute for |expected| < 1) of the expected value of residue (offset + t) % PERIOD.
// NaN is never close.
template <typename T, int KIND>
__device__ void count_close(const T *buf, unsigned long long n, unsigned int offset,
                            const Expect &e, unsigned long long *wrong) {
    const unsigned long long stride = (unsigned long long)gridDim.x * blockDim.x;
    unsigned long long t = (unsigned long long)blockIdx.x * blockDim.x + threadIdx.x;
    unsigned int r = (unsigned int)((offset + t) % PERIOD);
    const unsigned int step = (unsigned int)(stride % PERIOD);
    unsigned long long mine = 0;
    for (; t < n; t += stride) {
        double got = decode(buf[t], KIND);
        double want = e.value[r];
        double scale = fabs(want) > 1.0 ? fabs(want) : 1.0;
        mine += !(fabs(got - want) <= e.tol * scale);
        r += step;
        if (r >= PERIOD) r -= PERIOD;
    }
    add_count(wrong, mine);
}

extern "C" __global__ void heddle_count_close_f16(const unsigned short *buf, unsigned long long n,
                                                  unsigned int offset, Expect e,
                                                  unsigned long long *wrong) {
    count_close<unsigned short, 0>(buf, n, offset, e, wrong);
}

extern "C" __global__ void heddle_count_close_bf16(const unsigned short *buf, unsigned long long n,
                                                   unsigned int offset, Expect e,
                                                   unsigned long long *wrong) {
    count_close<unsigned short, 1>(buf, n, offset, e, wrong);
}

extern "C" __global__ void heddle_count_close_f32(const float *buf, unsigned long long n,
                                                  unsigned int offset, Expect e,
                                                  unsigned long long *wrong) {
    count_close<float, 0>(buf, n, offset, e, wrong);
}

extern "C" __global__ void heddle_count_close_f64(const double *buf, unsigned long long n,
                                                  unsigned int offset, Expect e,
                                                  unsigned long long *wrong) {
    count_close<double, 0>(buf, n, offset, e, wrong);
}
