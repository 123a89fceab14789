/* The C interface from C, without a GPU: the header compiles as C99, the static library links
   with nothing but libc (and libm, libdl, libpthread), and bad input is refused with the field
   named. scripts/test.sh builds and runs it; it exits non-zero on any mismatch. */
#include <stdio.h>
#include <string.h>

#include "kiln.h"

static int failures = 0;

static void expect(int got, int want, const char *needle, const char *what) {
    const char *message = kiln_last_error();
    if (got != want || strstr(message, needle) == NULL) {
        fprintf(stderr, "%s: got %d (%s), want %d with `%s`\n", what, got, message, want, needle);
        failures++;
    }
}

int main(void) {
    printf("%s\n", kiln_version());
    if (sizeof(kiln_attn_config) != 72) {
        fprintf(stderr, "kiln_attn_config is %zu bytes\n", sizeof(kiln_attn_config));
        failures++;
    }
    expect(kiln_attn_fwd(NULL, NULL), KILN_INVALID_ARGUMENT, "args is NULL", "NULL args");

    kiln_attn_config cfg = {
        .dtype = KILN_BF16, .batch = 1, .seqlen_q = 64, .seqlen_k = 64, .heads_q = 2,
        .heads_kv = 2, .head_dim = 64, .causal = 1, .window_left = -1, .window_right = -1,
        .softmax_scale = 0.125f,
    };
    size_t bytes = kiln_attn_bwd_workspace_bytes(&cfg);
    /* Two f32 statistics (LSE in base 2, delta) per query row. */
    if (bytes != 2 * (1 * 2 * 64 * 4)) {
        fprintf(stderr, "workspace of %zu bytes\n", bytes);
        failures++;
    }
    cfg.heads_q = 3;
    expect((int)kiln_attn_bwd_workspace_bytes(&cfg), 0, "heads_q (3) must be a multiple of heads_kv (2)",
           "GQA groups");
    cfg.heads_q = 2;

    kiln_tensor t = {.data = (void *)0x10000, .batch_stride = 8192, .seq_stride = 128, .head_stride = 64};
    kiln_attn_fwd_args args = {.cfg = cfg, .q = t, .k = t, .v = t, .o = t, .lse = (float *)0x80000};
    args.o.data = (void *)0x40000;
    args.q.seq_stride = 100;
    expect(kiln_attn_fwd(&args, NULL), KILN_INVALID_ARGUMENT, "q.seq_stride must be a multiple of 8",
           "stride");
    args.q.seq_stride = 128;
    args.cfg.dropout_p = 0.5f;
    expect(kiln_attn_fwd(&args, NULL), KILN_UNSUPPORTED, "dropout", "dropout");

    if (failures == 0) {
        printf("C interface smoke test: ok\n");
    }
    return failures != 0;
}
