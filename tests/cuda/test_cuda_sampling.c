/* Device sampling (kernels/cuda/cuda_sampling.h) against a host reference
 * written from the definition: greedy = argmax (lowest index on ties);
 * temperature/top-k/top-p keep-sets computed by sorting on the host; with
 * stratified uniforms u_i = (i + 0.5) / N the count of each id must be
 * N * p_id within 1 (each id owns one interval of [0, 1)). Skips (77)
 * without CUDA or a GPU. */
#include "kernels/cuda/cuda_sampling.h"
#include "tests/cuda/cuda_test_common.h"

static int cmp_desc(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x < y) - (x > y);
}

/* Host reference probabilities after temperature, top-k, top-p. */
static void ref_probs(const float *x, int32_t V, float temp, int32_t k, float p, double *prob) {
    float *s = malloc(sizeof(float) * V);
    memcpy(s, x, sizeof(float) * V);
    qsort(s, V, sizeof(float), cmp_desc);
    float kth = (k > 0 && k < V) ? s[k - 1] : s[V - 1];
    double z = 0.0;
    for (int32_t i = 0; i < V; i++)
        if (s[i] >= kth) z += exp(((double)s[i] - s[0]) / temp);
    float cut = kth;
    if (p < 1.0f) { /* highest values until the mass reaches p */
        double acc = 0.0;
        for (int32_t i = 0; i < V && s[i] >= kth; i++) {
            acc += exp(((double)s[i] - s[0]) / temp) / z;
            cut = s[i];
            if (acc >= p) break;
        }
    }
    double zz = 0.0;
    for (int32_t i = 0; i < V; i++) {
        prob[i] = x[i] >= cut ? exp(((double)x[i] - s[0]) / temp) : 0.0;
        zz += prob[i];
    }
    for (int32_t i = 0; i < V; i++) prob[i] /= zz;
    free(s);
}

static void test_greedy(backend_t *gpu, int32_t n, int32_t V) {
    float *x = malloc(sizeof(float) * (size_t)n * V);
    t_fill(x, (int64_t)n * V, -10.0f, 10.0f, 0);
    int32_t want[64], got[64];
    for (int32_t r = 0; r < n; r++) {
        float *row = x + (size_t)r * V;
        if (r % 2) { /* a tie: two equal maxima, the lower index wins */
            int32_t a = (int32_t)(t_uniform() * (V / 2)), b = a + 1 + (int32_t)(t_uniform() * (V / 2 - 1));
            row[a] = row[b] = 11.0f;
        }
        want[r] = 0;
        for (int32_t i = 1; i < V; i++)
            if (row[i] > row[want[r]]) want[r] = i;
    }
    float *d = t_alloc_upload(gpu, x, sizeof(float) * (size_t)n * V);
    memset(got, 0xff, sizeof(got));
    CHECK_OK(cuda_sample_greedy(gpu, d, n, V, got));
    for (int32_t r = 0; r < n; r++) CHECK_MSG(got[r] == want[r], "greedy row %d: %d vs %d", r, got[r], want[r]);
    gpu->ops->free(gpu, d);
    free(x);
}

static void test_sample(backend_t *gpu, int32_t V, float temp, int32_t k, float p) {
    const int32_t N = 2000;
    float *row = malloc(sizeof(float) * V), *x = malloc(sizeof(float) * (size_t)N * V);
    t_fill(row, V, -4.0f, 4.0f, 0);
    for (int32_t r = 0; r < N; r++) memcpy(x + (size_t)r * V, row, sizeof(float) * V);
    float *T = malloc(sizeof(float) * N), *P = malloc(sizeof(float) * N), *U = malloc(sizeof(float) * N);
    int32_t *K = malloc(sizeof(int32_t) * N), *ids = malloc(sizeof(int32_t) * N);
    for (int32_t r = 0; r < N; r++) {
        T[r] = temp; K[r] = k; P[r] = p;
        U[r] = (float)((r + 0.5) / N);
    }
    float *d = t_alloc_upload(gpu, x, sizeof(float) * (size_t)N * V);
    CHECK_OK(cuda_sample(gpu, d, N, V, T, K, P, U, ids));
    double *prob = malloc(sizeof(double) * V);
    ref_probs(row, V, temp, k, p, prob);
    int32_t *count = calloc(V, sizeof(int32_t));
    int bad = 0;
    for (int32_t r = 0; r < N; r++) {
        if (ids[r] < 0 || ids[r] >= V || prob[ids[r]] == 0.0) bad++;
        else count[ids[r]]++;
    }
    CHECK_MSG(bad == 0, "sample V %d T %g k %d p %g: %d ids outside the keep set", V, temp, k, p, bad);
    double worst = 0.0;
    for (int32_t i = 0; i < V; i++) {
        double dev = fabs(count[i] - N * prob[i]);
        if (dev > worst) worst = dev;
    }
    CHECK_MSG(worst <= 1.5, "sample V %d T %g k %d p %g: count off by %g from N*p", V, temp, k, p, worst);
    /* the draw is ordered by id: u increasing -> id non-decreasing */
    for (int32_t r = 1; r < N; r++) CHECK(ids[r] >= ids[r - 1]);
    gpu->ops->free(gpu, d);
    free(row); free(x); free(T); free(P); free(U); free(K); free(ids); free(prob); free(count);
}

/* A batch mixing greedy rows (temperature 0, with tied maxima) and sampled
 * rows: greedy rows give the lowest tied index, sampled rows stay in their
 * top-k set. */
static void test_mixed(backend_t *gpu) {
    enum { N = 4, V = 5000 };
    float *x = malloc(sizeof(float) * N * V);
    t_fill(x, (int64_t)N * V, -5.0f, 5.0f, 0);
    x[0 * V + 4000] = x[0 * V + 17] = 9.0f;
    x[2 * V + 3] = x[2 * V + 2] = 9.5f;
    float T[N] = {0.0f, 1.0f, 0.0f, 0.5f}, P[N] = {1.0f, 1.0f, 1.0f, 1.0f};
    float U[N] = {0.3f, 0.99f, 0.7f, 0.01f};
    int32_t K[N] = {0, 3, 0, 2}, ids[N];
    float *d = t_alloc_upload(gpu, x, sizeof(float) * N * V);
    CHECK_OK(cuda_sample(gpu, d, N, V, T, K, P, U, ids));
    CHECK_EQ_INT(ids[0], 17);
    CHECK_EQ_INT(ids[2], 2);
    for (int r = 1; r < N; r += 2) { /* sampled rows: one of the K[r] largest */
        int larger = 0;
        for (int i = 0; i < V; i++) larger += x[r * V + i] > x[r * V + ids[r]];
        CHECK_MSG(larger < K[r], "mixed row %d: id %d has %d larger logits (top_k %d)", r, ids[r], larger, K[r]);
    }
    gpu->ops->free(gpu, d);
    free(x);
}

int main(void) {
    int fail;
    backend_t *gpu = cuda_test_backend(&fail);
    if (!gpu) return fail ? 1 : CUDA_TEST_SKIP;
    test_greedy(gpu, 7, 49152);
    test_greedy(gpu, 3, 1000);
    test_greedy(gpu, 5, 128256);
    test_sample(gpu, 37, 1.0f, 0, 1.0f);
    test_sample(gpu, 37, 0.7f, 10, 1.0f);
    test_sample(gpu, 37, 1.3f, 0, 0.8f);
    test_sample(gpu, 3001, 0.9f, 40, 0.95f);
    test_sample(gpu, 3001, 1.0f, 1, 1.0f);
    test_mixed(gpu);
    /* bad input */
    float t = 1.0f, pp = 0.0f, u = 0.5f;
    int32_t k = 0, id;
    float *d = gpu->ops->alloc(gpu, 64 * sizeof(float));
    CHECK(cuda_sample(gpu, d, 1, 64, &t, &k, &pp, &u, &id) == BATON_ERR_INVALID_ARG);
    pp = 1.0f; u = 1.0f;
    CHECK(cuda_sample(gpu, d, 1, 64, &t, &k, &pp, &u, &id) == BATON_ERR_INVALID_ARG);
    CHECK(cuda_sample_greedy(gpu, NULL, 1, 64, &id) == BATON_ERR_INVALID_ARG);
    gpu->ops->free(gpu, d);
    backend_free(gpu);
    return TEST_DONE();
}
