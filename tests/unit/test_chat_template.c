/* Chat templates against the real Jinja templates (rendered with jinja2)
 * and llama.cpp's tokenization of those renderings:
 *   tests/data/tokenizer_chat_smollm2.txt  (the model file's own template,
 *       tests/golden/gen_tokenizer_smollm2.py)
 *   tests/data/tokenizer_chat_families.txt (Llama-3, Gemma, Phi-3, Llama-2,
 *       tests/golden/gen_tokenizer_chat_families.py) */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat_template.h"
#include "common/gguf.h"
#include "common/tokenizer.h"
#include "tests/test_util.h"
#include "tests/unit/test_tokenizer_util.h"

#define MAX_MSGS 8

typedef struct chat_case {
    size_t n;
    bool gen;
    bool check_ids;
    chat_message_t msgs[MAX_MSGS];
    char *role_buf[MAX_MSGS];
    char *text;
    size_t text_len;
    int32_t *ids;
    size_t n_ids;
} chat_case_t;

static void case_free(chat_case_t *c) {
    for (size_t i = 0; i < c->n; i++) {
        free(c->role_buf[i]);
        free((char *)c->msgs[i].content);
    }
    free(c->text);
    free(c->ids);
    memset(c, 0, sizeof(*c));
}

/* Reads one line [*pos, eol) and advances. */
static bool next_line(const char *data, size_t *pos, const char **line, size_t *len) {
    if (!data[*pos]) return false;
    const char *s = data + *pos;
    const char *nl = strchr(s, '\n');
    *len = nl ? (size_t)(nl - s) : strlen(s);
    *line = s;
    *pos += *len + (nl ? 1 : 0);
    return true;
}

/* Parses the body of a case after its "case" line. */
static bool read_case(const char *data, size_t *pos, chat_case_t *c) {
    const char *line;
    size_t len;
    for (size_t i = 0; i < c->n; i++) {
        if (!next_line(data, pos, &line, &len)) return false;
        const char *f[2];
        size_t fl[2];
        if (tt_fields(line, len, f, fl, 2) != 2) return false;
        c->role_buf[i] = strndup(f[0], fl[0]);
        size_t cl;
        c->msgs[i].role = c->role_buf[i];
        c->msgs[i].content = tt_unhex(f[1], fl[1], &cl);
        c->msgs[i].content_len = cl;
    }
    if (!next_line(data, pos, &line, &len) || strncmp(line, "text\t", 5)) return false;
    c->text = tt_unhex(line + 5, len - 5, &c->text_len);
    if (!next_line(data, pos, &line, &len) || strncmp(line, "ids\t", 4)) return false;
    c->ids = tt_parse_ids(line + 4, len - 4, &c->n_ids);
    return true;
}

static size_t count_id(const int32_t *ids, size_t n, int32_t id) {
    size_t k = 0;
    for (size_t i = 0; i < n; i++) k += ids[i] == id;
    return k;
}

/* Renders one case both ways and compares with the golden text and ids. */
static void check_case(const chat_template_t *ct, const tokenizer_t *tok, chat_case_t *c, const char *label) {
    char *text = NULL;
    size_t tl = 0;
    baton_status_t s = chat_template_render_text(ct, c->msgs, c->n, c->gen, &text, &tl);
    CHECK_MSG(s == BATON_OK, "%s: %s", label, baton_last_error());
    CHECK_MSG(s == BATON_OK && tl == c->text_len && memcmp(text, c->text, tl) == 0,
              "%s: rendering differs from the Jinja template:\n--- got\n%.*s\n--- want\n%.*s", label,
              (int)tl, text ? text : "", (int)c->text_len, c->text);
    free(text);
    int32_t *ids = NULL;
    size_t n = 0;
    s = chat_template_render(ct, c->msgs, c->n, c->gen, &ids, &n);
    CHECK_MSG(s == BATON_OK, "%s: %s", label, baton_last_error());
    if (s != BATON_OK) return;
    if (c->check_ids)
        CHECK_MSG(n == c->n_ids && memcmp(ids, c->ids, n * sizeof(int32_t)) == 0,
                  "%s: ids differ from llama.cpp (%zu vs %zu)", label, n, c->n_ids);
    /* the ids always spell the rendering back */
    char *dec = NULL;
    size_t dl = 0;
    CHECK_OK(tokenizer_decode(tok, ids, n, TOKENIZER_DECODE_SPECIAL | TOKENIZER_DECODE_KEEP_LEADING_SPACE,
                              &dec, &dl));
    if (tokenizer_kind(tok) == TOKENIZER_KIND_BPE)
        CHECK_MSG(dec && dl == c->text_len && memcmp(dec, c->text, dl) == 0, "%s: decode(render) != text", label);
    free(dec);
    free(ids);
}

static void test_smollm2(const tokenizer_t *tok, const gguf_file_t *f) {
    chat_template_t *ct = NULL;
    CHECK_OK(chat_template_init(f, tok, &ct));
    if (!ct) return;
    CHECK_EQ_INT(chat_template_family(ct), CHAT_TEMPLATE_CHATML);
    CHECK(!chat_template_is_fallback(ct));
    char *data = tt_read_source_file("tests/data/tokenizer_chat_smollm2.txt");
    CHECK(data != NULL);
    size_t pos = 0, n_cases = 0;
    const char *line;
    size_t len;
    int32_t im_start = tokenizer_token_id(tok, "<|im_start|>");
    int32_t im_end = tokenizer_token_id(tok, "<|im_end|>");
    int32_t eot = tokenizer_token_id(tok, "<|endoftext|>");
    while (data && next_line(data, &pos, &line, &len)) {
        if (len < 5 || strncmp(line, "case ", 5)) continue;
        chat_case_t c = {0};
        int n, gen, check;
        CHECK(sscanf(line, "case %d %d %d", &n, &gen, &check) == 3 && n <= MAX_MSGS);
        c.n = (size_t)n;
        c.gen = gen;
        c.check_ids = check;
        CHECK(read_case(data, &pos, &c));
        char label[64];
        snprintf(label, sizeof(label), "smollm2 chat %zu", n_cases);
        check_case(ct, tok, &c, label);
        if (!c.check_ids) {
            /* content spelling control tokens: only the scaffolding makes them */
            int32_t *ids = NULL;
            size_t ni = 0;
            CHECK_OK(chat_template_render(ct, c.msgs, c.n, c.gen, &ids, &ni));
            size_t turns = c.n + (c.n && strcmp(c.msgs[0].role, "system") ? 1 : 0);
            CHECK_EQ_INT(count_id(ids, ni, im_start), turns + (c.gen ? 1 : 0));
            CHECK_EQ_INT(count_id(ids, ni, im_end), turns);
            CHECK_EQ_INT(count_id(ids, ni, eot), 0);
            free(ids);
        }
        case_free(&c);
        n_cases++;
    }
    CHECK(n_cases >= 12);
    fprintf(stderr, "smollm2 chat: %zu cases\n", n_cases);
    free(data);

    /* bad input */
    chat_message_t bad_role[] = {{"robot", "x", 1}};
    int32_t *ids = NULL;
    size_t n = 0;
    CHECK_EQ_INT(chat_template_render(ct, bad_role, 1, true, &ids, &n), BATON_ERR_INVALID_ARG);
    CHECK(strstr(baton_last_error(), "robot") != NULL);
    chat_message_t bad_utf8[] = {{"user", "\xc3(", 2}};
    CHECK_EQ_INT(chat_template_render(ct, bad_utf8, 1, true, &ids, &n), BATON_ERR_INVALID_ARG);
    chat_message_t null_content[] = {{"user", NULL, 3}};
    CHECK_EQ_INT(chat_template_render(ct, null_content, 1, true, &ids, &n), BATON_ERR_INVALID_ARG);
    CHECK_EQ_INT(chat_template_render(ct, NULL, 1, true, &ids, &n), BATON_ERR_INVALID_ARG);
    CHECK(ids == NULL);
    chat_template_free(ct);
    chat_template_free(NULL);
}

static void test_families(const tokenizer_t *smol, const tokenizer_t *spm) {
    char *data = tt_read_source_file("tests/data/tokenizer_chat_families.txt");
    CHECK(data != NULL);
    if (!data) return;
    size_t pos = 0, n_cases = 0, n_templates = 0;
    const char *line;
    size_t len;
    chat_template_t *ct = NULL;
    const tokenizer_t *tok = NULL;
    char fam[32] = "";
    while (next_line(data, &pos, &line, &len)) {
        if (len > 9 && !strncmp(line, "template ", 9)) {
            chat_template_free(ct);
            ct = NULL;
            char vocab[32];
            int off = 0;
            CHECK(sscanf(line, "template %31s %31s %n", fam, vocab, &off) == 2);
            tok = !strcmp(vocab, "spm") ? spm : smol;
            size_t tl;
            char *tpl = tt_unhex(line + off, len - (size_t)off, &tl);
            CHECK_OK(chat_template_init_text(tpl, tl, tok, &ct));
            free(tpl);
            if (ct) {
                CHECK_MSG(!strcmp(chat_template_family_name(chat_template_family(ct)), fam),
                          "template %s detected as %s", fam, chat_template_family_name(chat_template_family(ct)));
                CHECK(!chat_template_is_fallback(ct));
            }
            n_templates++;
            continue;
        }
        if (len < 5 || strncmp(line, "case ", 5)) continue;
        chat_case_t c = {0};
        int n, gen;
        CHECK(sscanf(line, "case %d %d", &n, &gen) == 2 && n <= MAX_MSGS);
        c.n = (size_t)n;
        c.gen = gen;
        c.check_ids = true;
        CHECK(read_case(data, &pos, &c));
        char label[64];
        snprintf(label, sizeof(label), "%s chat %zu", fam, n_cases);
        if (ct) check_case(ct, tok, &c, label);
        case_free(&c);
        n_cases++;
    }
    chat_template_free(ct);
    CHECK_EQ_INT(n_templates, 4);
    fprintf(stderr, "families: %zu templates, %zu cases\n", n_templates, n_cases);
    free(data);
}

static void test_detect(const tokenizer_t *tok) {
    chat_template_family_t f;
    bool known;
    const char *mistral = "{{ bos_token }}{% for message in messages %}{% if message['role'] == 'user' %}"
                          "{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endif %}{% endfor %}";
    CHECK_OK(chat_template_detect(mistral, strlen(mistral), &f, &known));
    CHECK(known && f == CHAT_TEMPLATE_LLAMA2);
    const char *odd = "{% for m in messages %}### {{ m.role }}: {{ m.content }}\n{% endfor %}";
    CHECK_OK(chat_template_detect(odd, strlen(odd), &f, &known));
    CHECK(!known && f == CHAT_TEMPLATE_CHATML);
    CHECK_OK(chat_template_detect(NULL, 0, &f, &known));
    CHECK(!known);
    CHECK_EQ_INT(chat_template_detect(odd, 3, NULL, &known), BATON_ERR_INVALID_ARG);

    /* unknown template: ChatML, flagged, no default system prompt */
    chat_template_t *ct = NULL;
    CHECK_OK(chat_template_init_text(odd, strlen(odd), tok, &ct));
    if (!ct) return;
    CHECK(chat_template_is_fallback(ct));
    CHECK_EQ_INT(chat_template_family(ct), CHAT_TEMPLATE_CHATML);
    chat_message_t m[] = {{"user", "Hi", 2}};
    char *text = NULL;
    size_t tl = 0;
    CHECK_OK(chat_template_render_text(ct, m, 1, true, &text, &tl));
    const char want[] = "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n";
    CHECK(text && tl == sizeof(want) - 1 && memcmp(text, want, tl) == 0);
    free(text);
    chat_template_free(ct);
}

int main(void) {
    const char *path = test_default_model();
    CHECK(path != NULL);
    if (!path) return TEST_DONE();
    gguf_file_t *f = NULL, *fs = NULL;
    CHECK_OK(gguf_open(path, &f));
    char spm_path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(spm_path, sizeof(spm_path), "%s/tests/data/tokenizer_spm_tiny.gguf", src && *src ? src : ".");
    CHECK_OK(gguf_open(spm_path, &fs));
    tokenizer_t *tok = NULL, *spm = NULL;
    if (f) CHECK_OK(tokenizer_load(f, &tok));
    if (fs) CHECK_OK(tokenizer_load(fs, &spm));
    if (tok && f) test_smollm2(tok, f);
    if (tok) test_detect(tok);
    if (tok && spm) test_families(tok, spm);
    if (spm && fs) {
        chat_template_t *ct = NULL;
        CHECK_OK(chat_template_init(fs, spm, &ct));
        CHECK(ct && chat_template_family(ct) == CHAT_TEMPLATE_LLAMA2);
        chat_template_free(ct);
    }
    tokenizer_free(tok);
    tokenizer_free(spm);
    gguf_close(f);
    gguf_close(fs);
    return TEST_DONE();
}
