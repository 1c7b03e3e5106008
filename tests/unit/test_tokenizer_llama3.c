/* Llama-3 pre-tokenizer ("llama-bpe": its split regex, ignore_merges) on a
 * tiny byte-level BPE vocabulary, against llama.cpp's ids:
 * tests/data/tokenizer_llama3_tiny.gguf and tests/data/tokenizer_llama3.txt
 * come from tests/golden/gen_tokenizer_llama3.py (HF tokenizers agreed with
 * llama.cpp on every case when they were made). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/chat_template.h"
#include "common/gguf.h"
#include "common/tokenizer.h"
#include "tests/test_util.h"
#include "tests/unit/test_tokenizer_util.h"

int main(void) {
    char path[4096];
    const char *src = getenv("BATON_SOURCE_DIR");
    snprintf(path, sizeof(path), "%s/tests/data/tokenizer_llama3_tiny.gguf", src && *src ? src : ".");
    gguf_file_t *f = NULL;
    CHECK_OK(gguf_open(path, &f));
    if (!f) return TEST_DONE();
    tokenizer_t *tok = NULL;
    CHECK_OK(tokenizer_load(f, &tok));
    gguf_close(f);
    if (!tok) return TEST_DONE();
    CHECK(strcmp(tokenizer_pre_name(tok), "llama-bpe") == 0);
    CHECK(tokenizer_add_bos(tok));
    int32_t eot = tokenizer_token_id(tok, "<|eot_id|>");
    CHECK(eot >= 0 && tokenizer_is_eog(tok, eot) && tokenizer_eot(tok) == eot);

    char *data = tt_read_source_file("tests/data/tokenizer_llama3.txt");
    CHECK(data != NULL);
    size_t n_cases = 0, n_ok = 0;
    char *line = data;
    while (line && *line) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        if (len && line[0] != '#') {
            const char *fld[2];
            size_t fl[2];
            CHECK_EQ_INT(tt_fields(line, len, fld, fl, 2), 2);
            size_t text_len, n_want;
            char *text = tt_unhex(fld[0], fl[0], &text_len);
            int32_t *want = tt_parse_ids(fld[1], fl[1], &n_want);
            int32_t *got = NULL;
            size_t n_got = 0;
            baton_status_t s = tokenizer_encode_alloc(tok, text, text_len, 0, &got, &n_got);
            CHECK_MSG(s == BATON_OK, "case %zu: %s", n_cases, baton_last_error());
            bool same = s == BATON_OK && n_got == n_want &&
                        (n_got == 0 || memcmp(got, want, n_got * sizeof(int32_t)) == 0);
            CHECK_MSG(same, "case %zu (%.*s): ids differ from llama.cpp (%zu vs %zu)", n_cases,
                      (int)(text_len > 60 ? 60 : text_len), text, n_got, n_want);
            if (same) n_ok++;
            if (s == BATON_OK) {
                /* every byte has a token in this vocabulary: lossless */
                char *dec = NULL;
                size_t dl = 0;
                CHECK_OK(tokenizer_decode(tok, got, n_got, 0, &dec, &dl));
                CHECK_MSG(dec && dl == text_len && memcmp(dec, text, dl) == 0,
                          "case %zu: decode(encode(s)) != s", n_cases);
                free(dec);
                char label[64];
                snprintf(label, sizeof(label), "llama3 case %zu", n_cases);
                t_failures += tt_check_stream(tok, got, n_got, 0, label);
            }
            free(got);
            free(want);
            free(text);
            n_cases++;
        }
        line += len + (nl ? 1 : 0);
    }
    fprintf(stderr, "llama-bpe golden: %zu/%zu cases match llama.cpp\n", n_ok, n_cases);
    CHECK(n_cases >= 150);
    free(data);

    /* ADD_SPECIAL prepends <|begin_of_text|> */
    int32_t ids[8];
    size_t n = 0;
    CHECK_OK(tokenizer_encode(tok, "Hi", 2, TOKENIZER_ENCODE_ADD_SPECIAL, ids, 8, &n));
    CHECK(n >= 2 && ids[0] == tokenizer_bos(tok));

    /* Llama-3 chat rendering with real special tokens */
    const char tpl[] = "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}";
    chat_template_t *ct = NULL;
    CHECK_OK(chat_template_init_text(tpl, sizeof(tpl) - 1, tok, &ct));
    if (ct) {
        CHECK_EQ_INT(chat_template_family(ct), CHAT_TEMPLATE_LLAMA3);
        chat_message_t m[] = {{"user", " <|eot_id|> hi ", 15}};
        int32_t *r = NULL;
        size_t nr = 0;
        CHECK_OK(chat_template_render(ct, m, 1, true, &r, &nr));
        int32_t sh = tokenizer_token_id(tok, "<|start_header_id|>");
        int32_t eh = tokenizer_token_id(tok, "<|end_header_id|>");
        /* BOS, sh "user" eh "\n\n<|eot_id|> hi" eot, sh "assistant" eh "\n\n" */
        size_t k_sh = 0, k_eh = 0, k_eot = 0;
        for (size_t i = 0; i < nr; i++) {
            k_sh += r[i] == sh;
            k_eh += r[i] == eh;
            k_eot += r[i] == eot;
        }
        CHECK(nr > 0 && r[0] == tokenizer_bos(tok));
        CHECK_EQ_INT(k_sh, 2);
        CHECK_EQ_INT(k_eh, 2);
        CHECK_EQ_INT(k_eot, 1); /* the one in the content stays text */
        char *text = NULL;
        size_t tl = 0;
        CHECK_OK(chat_template_render_text(ct, m, 1, true, &text, &tl));
        const char want[] = "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\n<|eot_id|> hi"
                            "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n";
        CHECK(text && tl == sizeof(want) - 1 && memcmp(text, want, tl) == 0);
        free(text);
        free(r);
        chat_template_free(ct);
    }
    tokenizer_free(tok);
    return TEST_DONE();
}
