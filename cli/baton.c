/* baton: command-line front end.
 *
 *   baton generate --model FILE (--prompt TEXT | --chat TEXT) [options]
 *       Loads the model, runs prefill and greedy/sampled decoding on the
 *       chosen backend and streams the text to stdout (incremental
 *       detokenizer: only complete UTF-8 is written). Statistics go to
 *       stderr. Deterministic under greedy decoding (temperature 0, the
 *       default).
 *   baton bench-engine --model FILE [--threads N] [--prompt-tokens N] [--steps N]
 *       Prefill and decode throughput of the engine next to this machine's
 *       ceilings measured in the same run (OpenBLAS sgemm GFLOP/s at the
 *       model's FFN shape, memcpy GB/s).
 *
 * Exit status: 0 success, 1 runtime error (bad model file, prompt too long,
 * ...), 2 usage error. */
#include <cblas.h>
#include <errno.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/chat_template.h"
#include "common/gguf.h"
#include "common/kv_pool.h"
#include "common/model.h"
#include "common/sampling.h"
#include "common/tokenizer.h"
#include "kernels/backend.h"

#define KV_BLOCK_SIZE 16

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int fail(baton_status_t st, const char *what) {
    fprintf(stderr, "baton: error: %s: %s\n", what, baton_last_error());
    (void)st;
    return 1;
}

static int usage_error(const char *fmt, const char *arg) {
    fprintf(stderr, "baton: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\n(run `baton help` for usage)\n");
    return 2;
}

static void usage(FILE *f) {
    fprintf(f,
            "usage:\n"
            "  baton generate --model FILE (--prompt TEXT | --chat TEXT) [options]\n"
            "      --system TEXT        system message (with --chat)\n"
            "      --max-tokens N       tokens to generate (default 128)\n"
            "      --temperature T      0 = greedy (default 0)\n"
            "      --top-k K            (default 0 = off)\n"
            "      --top-p P            (default 1 = off)\n"
            "      --min-p P            (default 0 = off)\n"
            "      --repeat-penalty R   (default 1 = off)\n"
            "      --seed S             sampling seed (default 0)\n"
            "      --threads N          CPU threads (default: all)\n"
            "      --backend NAME       cpu or cuda (default cpu)\n"
            "      --ignore-eos         keep generating after end-of-generation tokens\n"
            "      --print-ids          print prompt and generated token ids on stderr\n"
            "  baton bench-engine --model FILE [--threads N] [--prompt-tokens N] [--steps N]\n"
            "                     [--backend NAME]\n");
}

static bool parse_long(const char *s, long lo, long hi, long *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || v < lo || v > hi) return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double lo, double hi, double *out) {
    if (!s || !*s) return false;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || *end || !(v >= lo && v <= hi)) return false;
    *out = v;
    return true;
}

typedef struct cli_opts {
    const char *model, *prompt, *chat, *system, *backend;
    long max_tokens, top_k, threads, prompt_tokens, steps;
    double temperature, top_p, min_p, repeat_penalty;
    unsigned long long seed;
    bool ignore_eos, print_ids;
} cli_opts_t;

/* Returns 0, or the exit code of a usage error. */
static int parse_opts(int argc, char **argv, cli_opts_t *o) {
    memset(o, 0, sizeof(*o));
    o->max_tokens = 128;
    o->top_p = 1.0;
    o->repeat_penalty = 1.0;
    o->backend = "cpu";
    o->prompt_tokens = 512;
    o->steps = 32;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        long l;
        double d;
#define NEED_VALUE()                                                                       \
    do {                                                                                   \
        if (!v) return usage_error("option %s needs a value", a);                         \
        i++;                                                                               \
    } while (0)
        if (!strcmp(a, "--model")) { NEED_VALUE(); o->model = v; }
        else if (!strcmp(a, "--prompt")) { NEED_VALUE(); o->prompt = v; }
        else if (!strcmp(a, "--chat")) { NEED_VALUE(); o->chat = v; }
        else if (!strcmp(a, "--system")) { NEED_VALUE(); o->system = v; }
        else if (!strcmp(a, "--backend")) { NEED_VALUE(); o->backend = v; }
        else if (!strcmp(a, "--max-tokens")) {
            NEED_VALUE();
            if (!parse_long(v, 0, 1L << 24, &l)) return usage_error("bad --max-tokens '%s'", v);
            o->max_tokens = l;
        } else if (!strcmp(a, "--top-k")) {
            NEED_VALUE();
            if (!parse_long(v, 0, 1L << 24, &l)) return usage_error("bad --top-k '%s'", v);
            o->top_k = l;
        } else if (!strcmp(a, "--threads")) {
            NEED_VALUE();
            if (!parse_long(v, 0, 1024, &l)) return usage_error("bad --threads '%s'", v);
            o->threads = l;
        } else if (!strcmp(a, "--prompt-tokens")) {
            NEED_VALUE();
            if (!parse_long(v, 1, 1L << 20, &l)) return usage_error("bad --prompt-tokens '%s'", v);
            o->prompt_tokens = l;
        } else if (!strcmp(a, "--steps")) {
            NEED_VALUE();
            if (!parse_long(v, 1, 1L << 20, &l)) return usage_error("bad --steps '%s'", v);
            o->steps = l;
        } else if (!strcmp(a, "--seed")) {
            NEED_VALUE();
            char *end;
            errno = 0;
            o->seed = strtoull(v, &end, 10);
            if (errno || *end || !*v || *v == '-') return usage_error("bad --seed '%s'", v);
        } else if (!strcmp(a, "--temperature")) {
            NEED_VALUE();
            if (!parse_double(v, 0, 100, &d)) return usage_error("bad --temperature '%s' (0..100)", v);
            o->temperature = d;
        } else if (!strcmp(a, "--top-p")) {
            NEED_VALUE();
            if (!parse_double(v, 1e-9, 1, &d)) return usage_error("bad --top-p '%s' (0..1]", v);
            o->top_p = d;
        } else if (!strcmp(a, "--min-p")) {
            NEED_VALUE();
            if (!parse_double(v, 0, 1, &d)) return usage_error("bad --min-p '%s' [0..1]", v);
            o->min_p = d;
        } else if (!strcmp(a, "--repeat-penalty")) {
            NEED_VALUE();
            if (!parse_double(v, 1e-6, 100, &d)) return usage_error("bad --repeat-penalty '%s'", v);
            o->repeat_penalty = d;
        } else if (!strcmp(a, "--ignore-eos")) o->ignore_eos = true;
        else if (!strcmp(a, "--print-ids")) o->print_ids = true;
        else return usage_error("unknown option '%s'", a);
#undef NEED_VALUE
    }
    if (!o->model) return usage_error("%s", "--model FILE is required");
    return 0;
}

/* Opens the model file and builds everything generate/bench need. */
typedef struct engine {
    backend_t *be;
    model_t *model;
    tokenizer_t *tok;
    chat_template_t *tmpl;
} engine_t;

static void engine_free(engine_t *e) {
    chat_template_free(e->tmpl);
    tokenizer_free(e->tok);
    model_free(e->model);
    backend_free(e->be);
    memset(e, 0, sizeof(*e));
}

static int engine_open(const cli_opts_t *o, bool want_tokenizer, bool want_template, engine_t *e) {
    memset(e, 0, sizeof(*e));
    gguf_file_t *f = NULL;
    baton_status_t st = gguf_open(o->model, &f);
    if (st != BATON_OK) return fail(st, o->model);
    if (want_tokenizer && (st = tokenizer_load(f, &e->tok)) != BATON_OK) {
        gguf_close(f);
        return fail(st, "tokenizer");
    }
    if (want_template && (st = chat_template_init(f, e->tok, &e->tmpl)) != BATON_OK) {
        gguf_close(f);
        engine_free(e);
        return fail(st, "chat template");
    }
    if ((st = backend_create(o->backend, (int)o->threads, &e->be)) != BATON_OK) {
        gguf_close(f);
        engine_free(e);
        return fail(st, "backend");
    }
    st = model_load_gguf(f, e->be, NULL, &e->model);
    gguf_close(f);
    if (st != BATON_OK) {
        engine_free(e);
        return fail(st, o->model);
    }
    return 0;
}

static int cmd_generate(int argc, char **argv) {
    cli_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    if (!o.prompt == !o.chat) return usage_error("%s", "give exactly one of --prompt TEXT or --chat TEXT");
    if (o.system && !o.chat) return usage_error("%s", "--system needs --chat");
    const char *text = o.prompt ? o.prompt : o.chat;
    if (!*text) {
        fprintf(stderr, "baton: error: the prompt is empty\n");
        return 1;
    }
    sampling_params_t sp = sampling_params_default();
    sp.temperature = (float)o.temperature;
    sp.top_k = (int32_t)o.top_k;
    sp.top_p = (float)o.top_p;
    sp.min_p = (float)o.min_p;
    sp.repetition_penalty = (float)o.repeat_penalty;
    sp.seed = o.seed;

    engine_t e;
    double t0 = now_s();
    if ((rc = engine_open(&o, true, o.chat != NULL, &e))) return rc;
    double t_load = now_s() - t0;
    const model_hparams_t *hp = model_hparams(e.model);

    int32_t *prompt = NULL;
    size_t n_prompt = 0;
    baton_status_t st;
    if (o.chat) {
        chat_message_t msgs[2];
        size_t n = 0;
        if (o.system) msgs[n++] = (chat_message_t){"system", o.system, strlen(o.system)};
        msgs[n++] = (chat_message_t){"user", o.chat, strlen(o.chat)};
        st = chat_template_render(e.tmpl, msgs, n, true, &prompt, &n_prompt);
    } else {
        st = tokenizer_encode_alloc(e.tok, o.prompt, strlen(o.prompt), TOKENIZER_ENCODE_ADD_SPECIAL,
                                    &prompt, &n_prompt);
    }
    if (st != BATON_OK) {
        engine_free(&e);
        return fail(st, "prompt");
    }
    rc = 1;
    sampler_t *smp = NULL;
    detok_t *dt = NULL;
    float *logits = NULL;
    int32_t *seq = NULL;
    kv_pool_t *pool = NULL;
    kv_block_table_t table;
    kv_block_table_init(&table);
    model_kv_t kv = {0};
    if (n_prompt == 0) {
        fprintf(stderr, "baton: error: the prompt encodes to no tokens\n");
        goto out;
    }
    if ((int64_t)n_prompt >= hp->n_ctx_train) {
        fprintf(stderr, "baton: error: the prompt has %zu tokens; the model's context length is %d "
                "(room is needed for at least one generated token)\n", n_prompt, hp->n_ctx_train);
        goto out;
    }
    int64_t max_new = o.max_tokens;
    if ((int64_t)n_prompt + max_new > hp->n_ctx_train) {
        max_new = hp->n_ctx_train - (int64_t)n_prompt;
        fprintf(stderr, "baton: note: generation capped at %lld tokens by the context length %d\n",
                (long long)max_new, hp->n_ctx_train);
    }
    if ((st = sampler_init(&sp, hp->n_vocab, &smp)) != BATON_OK) {
        fail(st, "sampling");
        goto out;
    }
    if ((st = detok_init(e.tok, 0, &dt)) != BATON_OK) {
        fail(st, "detokenizer");
        goto out;
    }
    const int64_t total = (int64_t)n_prompt + max_new;
    const int32_t n_blocks = (int32_t)((total + KV_BLOCK_SIZE - 1) / KV_BLOCK_SIZE);
    logits = malloc(sizeof(float) * (size_t)hp->n_vocab);
    seq = malloc(sizeof(int32_t) * (size_t)(total + 1));
    if (!logits || !seq) {
        fprintf(stderr, "baton: error: out of memory\n");
        goto out;
    }
    /* a pool just big enough for this request; the sequence's block table
     * grows with it (kv_block_table_reserve) */
    backend_kv_geom_t geom = model_kv_geom(e.model, n_blocks, KV_BLOCK_SIZE);
    if ((st = kv_pool_init(e.be, &geom, &pool)) != BATON_OK) {
        fail(st, "KV cache");
        goto out;
    }
    kv = (model_kv_t){*kv_pool_geom(pool), kv_pool_k_base(pool), kv_pool_v_base(pool)};
    memcpy(seq, prompt, sizeof(int32_t) * n_prompt);
    for (size_t i = 0; i < n_prompt; i++) sampler_accept(smp, prompt[i]);

    /* prefill in chunks of the forward's batch limit */
    const int32_t chunk = model_load_params_default().max_batch_tokens;
    double t_pf = now_s();
    for (int64_t pos = 0; pos < (int64_t)n_prompt; pos += chunk) {
        int32_t n = (int32_t)((int64_t)n_prompt - pos < chunk ? (int64_t)n_prompt - pos : chunk);
        if ((st = kv_block_table_reserve(&table, pool, (int32_t)pos + n)) != BATON_OK) {
            fail(st, "KV blocks");
            goto out;
        }
        model_seq_t q = {seq + pos, n, (int32_t)pos, table.blocks, table.n_blocks,
                         pos + n == (int64_t)n_prompt ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE};
        model_batch_t b = {&q, 1};
        if ((st = model_forward(e.model, &kv, &b, logits)) != BATON_OK) {
            fail(st, "prefill");
            goto out;
        }
    }
    t_pf = now_s() - t_pf;

    int64_t n_gen = 0;
    int64_t pos = (int64_t)n_prompt;
    double t_dec = now_s();
    const char *piece;
    size_t piece_len;
    while (n_gen < max_new) {
        sampling_result_t r;
        if ((st = sampler_sample(smp, logits, &r)) != BATON_OK) {
            fail(st, "sampling");
            goto out;
        }
        if (!o.ignore_eos && tokenizer_is_eog(e.tok, r.token)) break;
        sampler_accept(smp, r.token);
        seq[pos] = r.token;
        n_gen++;
        if (detok_push(dt, r.token, &piece, &piece_len) == BATON_OK && piece_len) {
            fwrite(piece, 1, piece_len, stdout);
            fflush(stdout);
        }
        if (n_gen == max_new) break;
        if ((st = kv_block_table_reserve(&table, pool, (int32_t)pos + 1)) != BATON_OK) {
            fail(st, "KV blocks");
            goto out;
        }
        model_seq_t q = {seq + pos, 1, (int32_t)pos, table.blocks, table.n_blocks, MODEL_LOGITS_LAST};
        model_batch_t b = {&q, 1};
        if ((st = model_forward(e.model, &kv, &b, logits)) != BATON_OK) {
            fail(st, "decode");
            goto out;
        }
        pos++;
    }
    t_dec = now_s() - t_dec;
    if (detok_flush(dt, &piece, &piece_len) == BATON_OK && piece_len) fwrite(piece, 1, piece_len, stdout);
    fputc('\n', stdout);
    fflush(stdout);

    if (o.print_ids) {
        fprintf(stderr, "prompt ids:");
        for (size_t i = 0; i < n_prompt; i++) fprintf(stderr, " %d", prompt[i]);
        fprintf(stderr, "\ngenerated ids:");
        for (int64_t i = 0; i < n_gen; i++) fprintf(stderr, " %d", seq[n_prompt + i]);
        fprintf(stderr, "\n");
    }
    fprintf(stderr,
            "baton: load %.2f s | prompt %zu tokens, prefill %.3f s (%.1f tokens/s) | generated %lld "
            "tokens, decode %.3f s (%.1f tokens/s) | backend %s\n",
            t_load, n_prompt, t_pf, n_prompt / (t_pf > 0 ? t_pf : 1e-9), (long long)n_gen, t_dec,
            n_gen > 0 ? n_gen / (t_dec > 0 ? t_dec : 1e-9) : 0.0, model_backend(e.model)->ops->name);
    rc = 0;
out:
    kv_block_table_release(&table, pool);
    kv_pool_free(pool);
    free(seq);
    free(logits);
    detok_free(dt);
    sampler_free(smp);
    free(prompt);
    engine_free(&e);
    return rc;
}

/* ------------------------------------------------------------- bench */

/* Best-of-`reps` OpenBLAS sgemm GFLOP/s for C[m,n] = A[m,k] B[n,k]^T (the
 * shape of one projection: m tokens, n outputs, k inputs). */
static double bench_sgemm(int m, int n, int k, int reps) {
    float *a = malloc(sizeof(float) * (size_t)m * k), *b = malloc(sizeof(float) * (size_t)n * k),
          *c = malloc(sizeof(float) * (size_t)m * n);
    if (!a || !b || !c) {
        free(a);
        free(b);
        free(c);
        return 0;
    }
    for (size_t i = 0; i < (size_t)m * k; i++) a[i] = (float)((i % 13) - 6) * 0.01f;
    for (size_t i = 0; i < (size_t)n * k; i++) b[i] = (float)((i % 7) - 3) * 0.01f;
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
        t = now_s() - t;
        if (t < best) best = t;
    }
    free(a);
    free(b);
    free(c);
    return 2.0 * m * n * k / best / 1e9;
}

/* Best-of-`reps` memcpy bandwidth in GB/s counting bytes read + written. */
static double bench_memcpy(size_t bytes, int reps) {
    char *src = malloc(bytes), *dst = malloc(bytes);
    if (!src || !dst) {
        free(src);
        free(dst);
        return 0;
    }
    memset(src, 1, bytes);
    memset(dst, 0, bytes);
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t = now_s();
        memcpy(dst, src, bytes);
        __asm__ volatile("" : : "r"(dst), "r"(src) : "memory"); /* keep the copy */
        t = now_s() - t;
        if (t < best) best = t;
    }
    volatile char sink = dst[bytes / 2];
    (void)sink;
    free(src);
    free(dst);
    return 2.0 * bytes / best / 1e9;
}

static int cmd_bench(int argc, char **argv) {
    cli_opts_t o;
    int rc = parse_opts(argc, argv, &o);
    if (rc) return rc;
    engine_t e;
    if ((rc = engine_open(&o, false, false, &e))) return rc;
    const model_hparams_t *hp = model_hparams(e.model);
    const int32_t P = (int32_t)(o.prompt_tokens < hp->n_ctx_train - o.steps - 1
                                    ? o.prompt_tokens : hp->n_ctx_train - o.steps - 1);
    const int32_t max_tokens = model_load_params_default().max_batch_tokens;
    const int batches[] = {1, 8, 32};
    const int32_t ctx_decode = 128; /* prompt length of each decoding sequence */
    /* non-embedding weights (the matmuls of one token) and the output head */
    const double E = hp->n_embd, F = hp->n_ff, QD = (double)hp->n_head * hp->head_dim,
                 KD = (double)hp->n_head_kv * hp->head_dim;
    const double w_layer = E * QD + 2 * E * KD + QD * E + 3 * E * F;
    const double w_all = hp->n_layer * w_layer + (double)hp->n_vocab * E;
    const size_t wsize = backend_dtype_size(model_backend(e.model)->weight_dtype);

    int32_t max_seqs = 32;
    int32_t blocks_per_seq = (P + o.steps + ctx_decode + KV_BLOCK_SIZE) / KV_BLOCK_SIZE + 1;
    model_kv_t kv = {0};
    float *logits = malloc(sizeof(float) * (size_t)hp->n_vocab * max_seqs);
    int32_t *tokens = malloc(sizeof(int32_t) * (size_t)(P + ctx_decode + o.steps + 1) * max_seqs);
    int32_t *bt = malloc(sizeof(int32_t) * (size_t)blocks_per_seq * max_seqs);
    model_seq_t *seqs = calloc((size_t)max_seqs, sizeof(model_seq_t));
    baton_status_t st;
    rc = 1;
    if (!logits || !tokens || !bt || !seqs) {
        fprintf(stderr, "baton: error: out of memory\n");
        goto out;
    }
    if ((st = model_kv_alloc(e.model, blocks_per_seq * max_seqs, KV_BLOCK_SIZE, &kv)) != BATON_OK) {
        fail(st, "KV cache");
        goto out;
    }
    for (int32_t i = 0; i < blocks_per_seq * max_seqs; i++) bt[i] = i;
    for (int64_t i = 0; i < (int64_t)(P + ctx_decode + o.steps + 1) * max_seqs; i++)
        tokens[i] = (int32_t)((i * 7919 + 13) % hp->n_vocab);

    /* ceilings */
    int shape_m = P < max_tokens ? P : max_tokens;
    double sgemm_gfs = bench_sgemm(shape_m, hp->n_ff, hp->n_embd, 5);
    double mem_gbs = bench_memcpy((size_t)256 << 20, 5);
    printf("ceilings: OpenBLAS sgemm [%d x %d x %d] %.1f GFLOP/s; memcpy %.2f GB/s (read+write)\n",
           shape_m, hp->n_ff, hp->n_embd, sgemm_gfs, mem_gbs);

    /* prefill: one sequence of P tokens, in chunks of max_batch_tokens, best of 3 */
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t = now_s();
        for (int32_t pos = 0; pos < P; pos += max_tokens) {
            int32_t n = P - pos < max_tokens ? P - pos : max_tokens;
            model_seq_t q = {tokens + pos, n, pos, bt, blocks_per_seq,
                             pos + n == P ? MODEL_LOGITS_LAST : MODEL_LOGITS_NONE};
            model_batch_t b = {&q, 1};
            if ((st = model_forward(e.model, &kv, &b, logits)) != BATON_OK) {
                fail(st, "prefill");
                goto out;
            }
        }
        t = now_s() - t;
        if (t < best) best = t;
    }
    /* FLOPs: 2 per weight per token for the layers (+ head once), attention
     * 4 * P^2/2 * QD per layer (QK^T and PV, causal) */
    double pf_flops = 2.0 * hp->n_layer * w_layer * P + 2.0 * hp->n_vocab * E +
                      hp->n_layer * 4.0 * QD * (double)P * P / 2;
    double pf_gfs = pf_flops / best / 1e9;
    printf("prefill: %d tokens in %.3f s = %.1f tokens/s, %.1f GFLOP/s = %.2f of the sgemm ceiling\n", P,
           best, P / best, pf_gfs, pf_gfs / sgemm_gfs);

    /* decode: B sequences of ctx_decode prompt tokens, then `steps` steps of B tokens */
    for (size_t bi = 0; bi < sizeof(batches) / sizeof(batches[0]); bi++) {
        int B = batches[bi];
        for (int s0 = 0; s0 < B; s0 += max_tokens / ctx_decode) {
            int ns = 0;
            for (int s = s0; s < B && ns < max_tokens / ctx_decode; s++, ns++)
                seqs[ns] = (model_seq_t){tokens + (size_t)s * (ctx_decode + o.steps + 1), ctx_decode, 0,
                                         bt + (size_t)s * blocks_per_seq, blocks_per_seq, MODEL_LOGITS_NONE};
            model_batch_t b = {seqs, ns};
            if ((st = model_forward(e.model, &kv, &b, NULL)) != BATON_OK) {
                fail(st, "decode prefill");
                goto out;
            }
        }
        double t = now_s();
        for (int step = 0; step < o.steps; step++) {
            for (int s = 0; s < B; s++)
                seqs[s] = (model_seq_t){tokens + (size_t)s * (ctx_decode + o.steps + 1) + ctx_decode + step,
                                        1, ctx_decode + step, bt + (size_t)s * blocks_per_seq,
                                        blocks_per_seq, MODEL_LOGITS_LAST};
            model_batch_t b = {seqs, B};
            if ((st = model_forward(e.model, &kv, &b, logits)) != BATON_OK) {
                fail(st, "decode");
                goto out;
            }
        }
        t = now_s() - t;
        /* bytes per step: every weight once, plus each sequence's K and V */
        double kv_bytes = 2.0 * hp->n_layer * KD * (ctx_decode + o.steps / 2.0) *
                          backend_dtype_size(kv.geom.dtype) * B;
        double gbs = (w_all * wsize + kv_bytes) * o.steps / t / 1e9;
        printf("decode batch %2d: %.1f tokens/s (%.2f ms/step), %.2f GB/s of weights+KV = %.2f of the "
               "memcpy ceiling\n",
               B, (double)B * o.steps / t, t / o.steps * 1e3, gbs, gbs / mem_gbs);
    }
    rc = 0;
out:
    model_kv_free(e.model, &kv);
    free(logits);
    free(tokens);
    free(bt);
    free(seqs);
    engine_free(&e);
    return rc;
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "help") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "generate")) return cmd_generate(argc - 2, argv + 2);
    if (!strcmp(argv[1], "bench-engine")) return cmd_bench(argc - 2, argv + 2);
    fprintf(stderr, "baton: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
