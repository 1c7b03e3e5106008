/* Two-process harness for the KV transfer tests and benchmark (see
 * kv_transfer_harness.h). */
#include "tests/integration/kv_transfer_harness.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/status.h"

enum { MSG_DESC = 1, MSG_CHECK = 2, MSG_RESULT = 3, MSG_QUIT = 4 };

double kvt_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t splitmix64(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void kvt_fill_block(uint8_t *dst, uint64_t bytes, uint64_t seed, int is_v, int32_t layer,
                    int32_t block) {
    uint64_t s = seed ^ ((uint64_t)(uint32_t)layer << 40) ^ ((uint64_t)(uint32_t)block << 8) ^
                 (uint64_t)(is_v ? 0xa5 : 0x3c);
    splitmix64(&s);
    for (uint64_t i = 0; i + 8 <= bytes; i += 8) {
        uint64_t v = splitmix64(&s);
        memcpy(dst + i, &v, 8);
    }
}

int kvt_shm_mode(void) {
    const char *e = getenv("BATON_KVT_SHM");
    return e && !strcmp(e, "1");
}

void kvt_pool_fill(const kv_transfer_pool_desc_t *p, uint64_t seed) {
    for (int32_t l = 0; l < p->n_layers; l++)
        for (int32_t b = 0; b < p->n_blocks; b++) {
            size_t off = ((size_t)l * p->n_blocks + b) * p->block_bytes;
            kvt_fill_block((uint8_t *)p->k_base + off, p->block_bytes, seed, 0, l, b);
            kvt_fill_block((uint8_t *)p->v_base + off, p->block_bytes, seed, 1, l, b);
        }
}

int kvt_pool_alloc(int32_t n_layers, int32_t n_blocks, uint64_t block_bytes, uint64_t seed,
                   kv_transfer_pool_desc_t *out) {
    size_t bytes = (size_t)n_layers * n_blocks * block_bytes;
    void *k = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (k == MAP_FAILED) return -1;
    void *v = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (v == MAP_FAILED) {
        munmap(k, bytes);
        return -1;
    }
    *out = (kv_transfer_pool_desc_t){.k_base = k, .v_base = v, .n_layers = n_layers,
                                     .n_blocks = n_blocks, .block_bytes = block_bytes};
    kvt_pool_fill(out, seed);
    return 0;
}

void kvt_pool_release(kv_transfer_pool_desc_t *pool) {
    size_t bytes = (size_t)pool->n_layers * pool->n_blocks * pool->block_bytes;
    if (pool->k_base) munmap(pool->k_base, bytes);
    if (pool->v_base) munmap(pool->v_base, bytes);
    pool->k_base = pool->v_base = NULL;
}

/* ---------- framing: u32 type, u32 length, payload ---------- */

static int write_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int read_all(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    while (len) {
        ssize_t n = read(fd, p, len);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int msg_send(int fd, uint32_t type, const void *payload, uint32_t len) {
    uint32_t hdr[2] = {type, len};
    if (write_all(fd, hdr, sizeof(hdr))) return -1;
    return len ? write_all(fd, payload, len) : 0;
}

/* Reads one message; *payload is malloc'd (NULL when empty). */
static int msg_recv(int fd, uint32_t *type, void **payload, uint32_t *len) {
    uint32_t hdr[2];
    if (read_all(fd, hdr, sizeof(hdr))) return -1;
    if (hdr[1] > (64u << 20)) return -1;
    void *p = NULL;
    if (hdr[1]) {
        p = malloc(hdr[1]);
        if (!p || read_all(fd, p, hdr[1])) {
            free(p);
            return -1;
        }
    }
    *type = hdr[0];
    *payload = p;
    *len = hdr[1];
    return 0;
}

/* ---------- receiver process ---------- */

static uint64_t receiver_check(const kv_transfer_pool_desc_t *pool, uint64_t own_seed,
                               uint64_t src_seed, const kv_transfer_block_pair_t *pairs,
                               size_t n_pairs) {
    int32_t *src_of = malloc(sizeof(int32_t) * pool->n_blocks);
    uint8_t *want = malloc(pool->block_bytes);
    if (!src_of || !want) {
        free(src_of);
        free(want);
        return UINT64_MAX;
    }
    for (int32_t b = 0; b < pool->n_blocks; b++) src_of[b] = -1;
    for (size_t i = 0; i < n_pairs; i++)
        if (pairs[i].dst_block >= 0 && pairs[i].dst_block < pool->n_blocks)
            src_of[pairs[i].dst_block] = pairs[i].src_block;
    uint64_t bad = 0;
    for (int is_v = 0; is_v < 2; is_v++) {
        const uint8_t *base = is_v ? pool->v_base : pool->k_base;
        for (int32_t l = 0; l < pool->n_layers; l++)
            for (int32_t b = 0; b < pool->n_blocks; b++) {
                if (src_of[b] >= 0)
                    kvt_fill_block(want, pool->block_bytes, src_seed, is_v, l, src_of[b]);
                else
                    kvt_fill_block(want, pool->block_bytes, own_seed, is_v, l, b);
                const uint8_t *got = base + ((size_t)l * pool->n_blocks + b) * pool->block_bytes;
                if (memcmp(got, want, pool->block_bytes) != 0)
                    for (uint64_t i = 0; i < pool->block_bytes; i++) bad += got[i] != want[i];
            }
    }
    free(src_of);
    free(want);
    return bad;
}

static int receiver_run(int fd, int32_t n_layers, int32_t n_blocks, uint64_t block_bytes,
                        uint64_t seed) {
    kv_transfer_pool_desc_t pd = {0};
    int shm = kvt_shm_mode();
    if (!shm && kvt_pool_alloc(n_layers, n_blocks, block_bytes, seed, &pd)) {
        fprintf(stderr, "receiver: pool allocation failed\n");
        return 2;
    }
    int rc = 2;
    kv_transfer_engine_t *eng = NULL;
    kv_transfer_pool_t *pool = NULL;
    void *desc = NULL;
    size_t desc_len = 0;
    kv_transfer_engine_config_t cfg = {.no_peer_error_handling = shm};
    if (kv_transfer_engine_init(&cfg, &eng) != BATON_OK) {
        fprintf(stderr, "receiver: %s\n", baton_last_error());
        goto out;
    }
    if (shm) {
        /* UCX allocates the pool (shared memory): fill it in place. */
        if (kv_transfer_pool_alloc(eng, n_layers, n_blocks, block_bytes, &pool) != BATON_OK) {
            fprintf(stderr, "receiver: %s\n", baton_last_error());
            goto out;
        }
        pd = *kv_transfer_pool_get_desc(pool);
        kvt_pool_fill(&pd, seed);
    } else if (kv_transfer_pool_register(eng, &pd, &pool) != BATON_OK) {
        fprintf(stderr, "receiver: %s\n", baton_last_error());
        goto out;
    }
    if (kv_transfer_pool_pack(pool, &desc, &desc_len) != BATON_OK) {
        fprintf(stderr, "receiver: %s\n", baton_last_error());
        goto out;
    }
    if (msg_send(fd, MSG_DESC, desc, (uint32_t)desc_len)) goto out;
    for (;;) {
        struct pollfd pfd[2] = {{.fd = kv_transfer_engine_event_fd(eng), .events = POLLIN},
                                {.fd = fd, .events = POLLIN}};
        poll(pfd, 2, 100);
        if (kv_transfer_engine_progress(eng) != BATON_OK) {
            fprintf(stderr, "receiver: %s\n", baton_last_error());
            goto out;
        }
        if (!(pfd[1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        uint32_t type, len;
        void *payload;
        if (msg_recv(fd, &type, &payload, &len)) goto out; /* sender gone */
        if (type == MSG_QUIT) {
            free(payload);
            rc = 0;
            goto out;
        }
        if (type == MSG_CHECK && len >= 8 && (len - 8) % sizeof(kv_transfer_block_pair_t) == 0) {
            uint64_t src_seed;
            memcpy(&src_seed, payload, 8);
            size_t n = (len - 8) / sizeof(kv_transfer_block_pair_t);
            uint64_t bad = receiver_check(&pd, seed, src_seed,
                                          (const kv_transfer_block_pair_t *)((uint8_t *)payload + 8), n);
            free(payload);
            if (msg_send(fd, MSG_RESULT, &bad, sizeof(bad))) goto out;
            continue;
        }
        free(payload);
        fprintf(stderr, "receiver: unexpected message %u\n", type);
        goto out;
    }
out:
    free(desc);
    kv_transfer_pool_free(pool);
    kv_transfer_engine_free(eng);
    if (!shm) kvt_pool_release(&pd);
    close(fd);
    return rc;
}

int kvt_receiver_main_if_requested(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "--kvt-receiver") != 0) return -1;
    if (argc != 7) {
        fprintf(stderr, "usage: %s --kvt-receiver FD N_LAYERS N_BLOCKS BLOCK_BYTES SEED\n", argv[0]);
        return 2;
    }
    return receiver_run(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]),
                        strtoull(argv[5], NULL, 10), strtoull(argv[6], NULL, 10));
}

int kvt_receiver_start(int32_t n_layers, int32_t n_blocks, uint64_t block_bytes, uint64_t seed,
                       kvt_receiver_t *out) {
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv)) return -1;
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n <= 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    exe[n] = 0;
    pid_t pid = fork();
    if (pid < 0) {
        close(sv[0]);
        close(sv[1]);
        return -1;
    }
    if (pid == 0) {
        close(sv[0]);
        int fd = dup(sv[1]); /* without CLOEXEC */
        char a[6][32];
        snprintf(a[0], 32, "%d", fd);
        snprintf(a[1], 32, "%d", n_layers);
        snprintf(a[2], 32, "%d", n_blocks);
        snprintf(a[3], 32, "%llu", (unsigned long long)block_bytes);
        snprintf(a[4], 32, "%llu", (unsigned long long)seed);
        execl(exe, exe, "--kvt-receiver", a[0], a[1], a[2], a[3], a[4], (char *)NULL);
        _exit(127);
    }
    close(sv[1]);
    struct pollfd pfd = {.fd = sv[0], .events = POLLIN};
    uint32_t type, len;
    void *payload = NULL;
    if (poll(&pfd, 1, 20000) != 1 || msg_recv(sv[0], &type, &payload, &len) || type != MSG_DESC) {
        free(payload);
        kill(pid, SIGKILL);
        waitpid(pid, NULL, 0);
        close(sv[0]);
        return -1;
    }
    *out = (kvt_receiver_t){.pid = pid, .sock = sv[0], .desc = payload, .desc_len = len};
    return 0;
}

int kvt_receiver_check(kvt_receiver_t *r, uint64_t src_seed, const kv_transfer_block_pair_t *pairs,
                       size_t n_pairs, uint64_t *bad_bytes) {
    size_t len = 8 + n_pairs * sizeof(*pairs);
    uint8_t *buf = malloc(len);
    if (!buf) return -1;
    memcpy(buf, &src_seed, 8);
    memcpy(buf + 8, pairs, n_pairs * sizeof(*pairs));
    int rc = msg_send(r->sock, MSG_CHECK, buf, (uint32_t)len);
    free(buf);
    if (rc) return -1;
    uint32_t type, rlen;
    void *payload = NULL;
    if (msg_recv(r->sock, &type, &payload, &rlen) || type != MSG_RESULT || rlen != 8) {
        free(payload);
        return -1;
    }
    memcpy(bad_bytes, payload, 8);
    free(payload);
    return 0;
}

static void receiver_release(kvt_receiver_t *r) {
    free(r->desc);
    r->desc = NULL;
    if (r->sock >= 0) close(r->sock);
    r->sock = -1;
    r->pid = 0;
}

int kvt_receiver_stop(kvt_receiver_t *r) {
    if (r->pid <= 0) return -1;
    msg_send(r->sock, MSG_QUIT, NULL, 0);
    int status = 0;
    waitpid(r->pid, &status, 0);
    receiver_release(r);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
}

void kvt_receiver_kill(kvt_receiver_t *r) {
    if (r->pid <= 0) return;
    kill(r->pid, SIGKILL);
    waitpid(r->pid, NULL, 0);
    receiver_release(r);
}

/* ---------- block tables ---------- */

static uint64_t rng_below(uint64_t *s, uint64_t n) { return splitmix64(s) % n; }

static void shuffle(size_t *a, size_t n, uint64_t *s) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)rng_below(s, i);
        size_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* Places runs (lengths len[i]) in a space of `space` blocks in a random
 * order with random gaps; writes each run's first block to start[i]. */
static int place_runs(const int *len, size_t n_runs, int32_t space, size_t total, uint64_t *s,
                      int32_t *start) {
    if ((size_t)space < total) return -1;
    size_t *order = malloc(n_runs * sizeof(size_t));
    size_t *gap = calloc(n_runs + 1, sizeof(size_t));
    if (!order || !gap) {
        free(order);
        free(gap);
        return -1;
    }
    for (size_t i = 0; i < n_runs; i++) order[i] = i;
    shuffle(order, n_runs, s);
    for (size_t extra = (size_t)space - total; extra; extra--) gap[rng_below(s, n_runs + 1)]++;
    int32_t pos = 0;
    for (size_t k = 0; k < n_runs; k++) {
        pos += (int32_t)gap[k];
        start[order[k]] = pos;
        pos += len[order[k]];
    }
    free(order);
    free(gap);
    return 0;
}

int kvt_make_table(uint64_t rng_seed, int32_t src_blocks, int32_t dst_blocks, size_t n_pairs,
                   int max_run, kv_transfer_block_pair_t *out) {
    uint64_t s = rng_seed;
    int *len = malloc(n_pairs * sizeof(int));
    int32_t *src_start = malloc(n_pairs * sizeof(int32_t));
    int32_t *dst_start = malloc(n_pairs * sizeof(int32_t));
    int rc = -1;
    if (!len || !src_start || !dst_start) goto out;
    size_t n_runs = 0, total = 0;
    while (total < n_pairs) {
        int l = 1 + (int)rng_below(&s, (uint64_t)max_run);
        if (total + (size_t)l > n_pairs) l = (int)(n_pairs - total);
        len[n_runs++] = l;
        total += (size_t)l;
    }
    if (place_runs(len, n_runs, src_blocks, total, &s, src_start) ||
        place_runs(len, n_runs, dst_blocks, total, &s, dst_start))
        goto out;
    size_t k = 0;
    for (size_t r = 0; r < n_runs; r++)
        for (int i = 0; i < len[r]; i++, k++)
            out[k] = (kv_transfer_block_pair_t){src_start[r] + i, dst_start[r] + i};
    rc = 0;
out:
    free(len);
    free(src_start);
    free(dst_start);
    return rc;
}
