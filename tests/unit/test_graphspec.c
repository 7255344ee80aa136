/* test_graphspec.c: Check suite for model.type graph: common/graphspec.c (structure, order,
 * shapes, every kind of error with its node, key and line, JSON and the canonical source) and
 * engine/model_graph.c (parameter names and shapes, errors naming the node). */
#include <check.h>
#include <stdio.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/graphspec.h"
#include "common/jobspec.h"
#include "engine/engine.h"
#include "engine/model.h"
#include "tests/unit/support/check_run.h"

/* Lines 1-6; the nodes start at line 7. */
#define GHEAD                                                                                      \
    "name: g\n"                                                 /* 1 */                            \
    "data: {format: synthetic, image: [1, 8, 8], classes: 4}\n" /* 2 */                            \
    "train: {steps: 1, batch_size: 4, optimizer: {lr: 0.1}}\n"  /* 3 */                            \
    "model:\n"                                                  /* 4 */                            \
    "  type: graph\n"                                           /* 5 */                            \
    "  nodes:\n"                                                /* 6 */

/* A conv block with a residual add, pooling, concat, flatten, dropout and a linear head. */
static const char *const NODES[] = {
    "    - {name: x, op: input, shape: [1, 8, 8]}\n",                                    /* 7 */
    "    - {name: c1, op: conv2d, inputs: x, out_channels: 4, kernel: 3, padding: 1}\n", /* 8 */
    "    - {name: b1, op: batchnorm2d, inputs: c1}\n",                                   /* 9 */
    "    - {name: r1, op: relu, inputs: b1}\n",                                          /* 10 */
    "    - {name: c2, op: conv2d, inputs: r1, out_channels: 4, kernel: 3, padding: 1, bias: false, "
    "init: kaiming_normal}\n",                                               /* 11 */
    "    - {name: sc, op: conv2d, inputs: x, out_channels: 4, kernel: 1}\n", /* 12 */
    "    - {name: add, op: add, inputs: [c2, sc]}\n",                        /* 13 */
    "    - {name: p, op: maxpool, inputs: add, kernel: 2}\n",                /* 14 */
    "    - {name: cat, op: concat, inputs: [p, p], axis: 1}\n",              /* 15 */
    "    - {name: f, op: flatten, inputs: cat}\n",                           /* 16 */
    "    - {name: d, op: dropout, inputs: f, p: 0.1}\n",                     /* 17 */
    "    - {name: fc, op: linear, inputs: d, out_features: 4}\n",            /* 18 */
    "    - {name: loss, op: cross_entropy, inputs: fc}\n",                   /* 19 */
};
enum { N_NODES = sizeof(NODES) / sizeof(NODES[0]) };

/* Lines 1-6 of a language model on text; the nodes start at line 7. */
#define GPT_HEAD                                                                                   \
    "name: g\n"                                                /* 1 */                             \
    "data: {format: text, train_files: [t.txt]}\n"             /* 2 */                             \
    "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n" /* 3 */                             \
    "model:\n"                                                 /* 4 */                             \
    "  type: graph\n"                                          /* 5 */                             \
    "  nodes:\n"                                               /* 6 */

/* One GPT block (attention only) with position embeddings and a tied output layer. */
static const char *const GPT_NODES[] = {
    "    - {name: idx, op: tokens, context: 8, vocab: 16}\n",                      /* 7 */
    "    - {name: wte, op: embedding, inputs: idx, vocab: 16, d_model: 12}\n",     /* 8 */
    "    - {name: wpe, op: pos_embedding, inputs: wte, context: 8}\n",             /* 9 */
    "    - {name: ln, op: layernorm, inputs: wpe}\n",                              /* 10 */
    "    - {name: qkv, op: linear, inputs: ln, out_features: 36, init: normal}\n", /* 11 */
    "    - {name: attn, op: causal_attention, inputs: qkv, heads: 2}\n",           /* 12 */
    "    - {name: proj, op: linear, inputs: attn, out_features: 12, init: normal, "
    "residual_layers: 1}\n",                                            /* 13 */
    "    - {name: res, op: add, inputs: [wpe, proj]}\n",                /* 14 */
    "    - {name: head, op: tied_linear, inputs: res, tied_to: wte}\n", /* 15 */
    "    - {name: loss, op: cross_entropy, inputs: head}\n",            /* 16 */
};
enum { N_GPT_NODES = sizeof(GPT_NODES) / sizeof(GPT_NODES[0]) };

/* @head and the @n @nodes with node @replace (-1: none) swapped for @with (NULL: dropped) and
 * @extra appended (NULL: nothing). */
static char *graph_text_of(const char *head, const char *const *nodes, int n, int replace,
                           const char *with, const char *extra)
{
    static char buf[8192];
    snprintf(buf, sizeof(buf), "%s", head);
    for (int i = 0; i < n; i++)
        if (i != replace || with)
            strncat(buf, i == replace ? with : nodes[i], sizeof(buf) - strlen(buf) - 1);
    if (extra)
        strncat(buf, extra, sizeof(buf) - strlen(buf) - 1);
    return buf;
}

static char *graph_text(int replace, const char *with, const char *extra)
{
    return graph_text_of(GHEAD, NODES, N_NODES, replace, with, extra);
}

static char *gpt_text(int replace, const char *with, const char *extra)
{
    return graph_text_of(GPT_HEAD, GPT_NODES, N_GPT_NODES, replace, with, extra);
}

static struct mge_jobspec *parse_ok(const char *text)
{
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    int rc = mge_jobspec_parse("job.yaml", text, strlen(text), NULL, 0, &spec, &err);
    ck_assert_msg(rc == MGE_OK, "rc %d: %s", rc, err.message);
    return spec;
}

static const struct mge_gnode *node(const struct mge_graphspec *gs, const char *name)
{
    for (int i = 0; i < gs->n; i++)
        if (!strcmp(gs->nodes[i].name, name))
            return &gs->nodes[i];
    ck_abort_msg("no node %s", name);
    return NULL;
}

static void assert_shape(const struct mge_gnode *nd, int ndim, const int64_t *want)
{
    ck_assert_int_eq(nd->out_ndim, ndim);
    for (int d = 0; d < ndim; d++)
        ck_assert_msg(nd->out_shape[d] == want[d], "%s dim %d: %lld, want %lld", nd->name, d,
                      (long long)nd->out_shape[d], (long long)want[d]);
}

START_TEST(test_graphspec_parse_and_shapes)
{
    struct mge_jobspec *s = parse_ok(graph_text(-1, NULL, NULL));
    const struct mge_graphspec *gs = s->model.graph;
    ck_assert_int_eq(s->model.type, MGE_MODEL_GRAPH);
    ck_assert_str_eq(mge_model_type_name(s->model.type), "graph");
    ck_assert_ptr_nonnull(gs);
    ck_assert_int_eq(gs->n, N_NODES);
    ck_assert_str_eq(gs->nodes[gs->input].name, "x");
    ck_assert_str_eq(gs->nodes[gs->loss].name, "loss");
    for (int i = 0; i < gs->n; i++) /* listed in a working order: kept */
        ck_assert_int_eq(gs->order[i], i);
    ck_assert_int_eq(node(gs, "x")->line, 7);
    ck_assert_int_eq(node(gs, "c2")->init, MGE_GINIT_KAIMING_NORMAL);
    ck_assert_int_eq(node(gs, "c2")->bias, 0);
    ck_assert_int_eq(node(gs, "c1")->bias, 1);
    ck_assert_int_eq(node(gs, "c1")->stride, 1);
    ck_assert_int_eq(node(gs, "p")->stride, 2); /* a pool's stride defaults to its kernel */
    ck_assert_double_eq(node(gs, "b1")->eps, 1e-5);
    ck_assert_double_eq(node(gs, "b1")->momentum, 0.1);
    ck_assert_double_eq(node(gs, "d")->p, 0.1);
    assert_shape(node(gs, "x"), 4, (int64_t[]){4, 1, 8, 8});
    assert_shape(node(gs, "add"), 4, (int64_t[]){4, 4, 8, 8});
    assert_shape(node(gs, "p"), 4, (int64_t[]){4, 4, 4, 4});
    assert_shape(node(gs, "cat"), 4, (int64_t[]){4, 8, 4, 4});
    assert_shape(node(gs, "f"), 2, (int64_t[]){4, 128});
    assert_shape(node(gs, "fc"), 2, (int64_t[]){4, 4});
    ck_assert_int_eq(node(gs, "loss")->out_ndim, 0);
    ck_assert_int_eq(mge_graphspec_input_numel(gs), 64);
    mge_jobspec_free(s);
}
END_TEST

/* Nodes may be listed in any order that has no cycle: inputs run first. */
START_TEST(test_graphspec_order)
{
    static const char text[] = GHEAD "    - {name: loss, op: cross_entropy, inputs: fc}\n"
                                     "    - {name: fc, op: linear, inputs: h, out_features: 4}\n"
                                     "    - {name: h, op: tanh, inputs: f}\n"
                                     "    - {name: f, op: flatten, inputs: x}\n"
                                     "    - {name: x, op: input, shape: [1, 8, 8]}\n";
    struct mge_jobspec *s = parse_ok(text);
    const struct mge_graphspec *gs = s->model.graph;
    static const char *const want[] = {"x", "f", "h", "fc", "loss"};
    for (int i = 0; i < 5; i++)
        ck_assert_str_eq(gs->nodes[gs->order[i]].name, want[i]);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_graphspec_reshape_and_broadcast)
{
    static const char text[] =
        GHEAD "    - {name: x, op: input, shape: [64]}\n"
              "    - {name: r, op: reshape, inputs: x, shape: [4, -1]}\n"
              "    - {name: ln, op: layernorm, inputs: r}\n"
              "    - {name: m, op: mul, inputs: [ln, r]}\n"
              "    - {name: s, op: sub, inputs: [m, g]}\n"
              "    - {name: g, op: gelu, inputs: r}\n"
              "    - {name: a, op: avgpool, inputs: q, kernel: 2, stride: 1, padding: 1}\n"
              "    - {name: q, op: reshape, inputs: s, shape: [1, 16, 4]}\n"
              "    - {name: gp, op: global_avgpool, inputs: a}\n"
              "    - {name: sg, op: sigmoid, inputs: gp}\n"
              "    - {name: fc, op: linear, inputs: sg, out_features: 4, bias: false}\n"
              "    - {name: loss, op: cross_entropy, inputs: fc}\n";
    struct mge_jobspec *s = parse_ok(text);
    const struct mge_graphspec *gs = s->model.graph;
    assert_shape(node(gs, "r"), 3, (int64_t[]){4, 4, 16});
    assert_shape(node(gs, "s"), 3, (int64_t[]){4, 4, 16});
    assert_shape(node(gs, "a"), 4, (int64_t[]){4, 1, 17, 5});
    assert_shape(node(gs, "gp"), 2, (int64_t[]){4, 1});
    mge_jobspec_free(s);
}
END_TEST

/* @text must be refused at @line with @key and a message containing @msg (case @n). */
static void assert_refused(int n, const char *text, int line, const char *key, const char *msg)
{
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    int rc = mge_jobspec_parse("job.yaml", text, strlen(text), NULL, 0, &spec, &err);
    ck_assert_msg(rc == MGE_SPEC, "case %d: rc %d (%s)", n, rc, err.message);
    ck_assert_ptr_null(spec);
    ck_assert_msg(err.line == line, "case %d: line %d, want %d (%s)", n, err.line, line,
                  err.message);
    ck_assert_msg(!strcmp(err.key, key), "case %d: key '%s', want '%s' (%s)", n, err.key, key,
                  err.message);
    ck_assert_msg(strstr(err.message, msg), "case %d: message '%s' lacks '%s'", n, err.message,
                  msg);
    ck_assert_msg(!strncmp(err.message, "job.yaml:", 9), "case %d: '%s'", n, err.message);
}

/* The most nodes there may be, as a chain listed backwards (so the order is the reverse) with
 * every input named from the far end: no recursion depth, no quadratic name lookup. */
START_TEST(test_graphspec_large)
{
    size_t cap = 400000, o;
    char *text = mge_malloc(cap);
    struct mge_jobspec *s;
    const struct mge_graphspec *gs;
    ck_assert_ptr_nonnull(text);
    o = (size_t)snprintf(text, cap, "%s", GHEAD);
    o += (size_t)snprintf(text + o, cap - o,
                          "    - {name: loss, op: cross_entropy, inputs: fc}\n"
                          "    - {name: fc, op: linear, inputs: n%d, out_features: 4}\n",
                          MGE_GRAPH_MAX_NODES - 3);
    for (int i = MGE_GRAPH_MAX_NODES - 3; i >= 1; i--)
        o += (size_t)snprintf(text + o, cap - o, "    - {name: n%d, op: relu, inputs: %s%d}\n", i,
                              i > 1 ? "n" : "x", i > 1 ? i - 1 : 0);
    o += (size_t)snprintf(text + o, cap - o, "    - {name: x0, op: input, shape: [64]}\n");
    ck_assert_uint_lt(o, cap);
    s = parse_ok(text);
    gs = s->model.graph;
    ck_assert_int_eq(gs->n, MGE_GRAPH_MAX_NODES);
    for (int k = 0; k < gs->n; k++) /* listed backwards: runs forwards */
        ck_assert_int_eq(gs->order[k], gs->n - 1 - k);
    mge_jobspec_free(s);
    /* one more node is refused */
    snprintf(text + o, cap - o, "    - {name: extra, op: relu, inputs: x0}\n");
    assert_refused(0, text, 7, "model.nodes", "got 4097 nodes");
    mge_free(text);
}
END_TEST

struct err_case {
    int replace;       /* node to replace (-1: none) */
    const char *with;  /* its new text (NULL: dropped) */
    const char *extra; /* appended node (NULL: none) */
    int line;
    const char *key;
    const char *msg;
};

static const struct err_case err_cases[] = {
    /* unknown op, with a suggestion */
    {3, "    - {name: r1, op: rleu, inputs: b1}\n", NULL, 10, "model.nodes[3].op",
     "node `r1`: unknown op 'rleu' (did you mean 'relu'?)"},
    {3, "    - {name: r1, op: softmax2, inputs: b1}\n", NULL, 10, "model.nodes[3].op",
     "unknown op 'softmax2' (ops: docs/job-spec.md"},
    /* unknown input name */
    {3, "    - {name: r1, op: relu, inputs: b2}\n", NULL, 10, "model.nodes[3].inputs",
     "node `r1`: input 'b2' is not a node of the graph"},
    {6, "    - {name: add, op: add, inputs: [c2, nowhere]}\n", NULL, 13, "model.nodes[6].inputs",
     "node `add`: input 'nowhere' is not a node of the graph"},
    /* a cycle */
    {1, "    - {name: c1, op: conv2d, inputs: r1, out_channels: 4, kernel: 3, padding: 1}\n", NULL,
     8, "model.nodes[1].inputs",
     "node `c1`: the graph has a cycle: `c1` reads `r1` reads `b1` reads `c1`"},
    {3, "    - {name: r1, op: relu, inputs: r1}\n", NULL, 10, "model.nodes[3].inputs",
     "node `r1`: the graph has a cycle: `r1` reads `r1`"},
    /* duplicate names */
    {5, "    - {name: c2, op: conv2d, inputs: x, out_channels: 4, kernel: 1}\n", NULL, 12,
     "model.nodes[5].name", "duplicate node name `c2` (first given at line 11)"},
    /* bad attributes */
    {1, "    - {name: c1, op: conv2d, inputs: x, out_channels: 4, kernel: 0, padding: 1}\n", NULL,
     8, "model.nodes[1].kernel", "node `c1`: expected an integer between 1 and 1024, got '0'"},
    {1, "    - {name: c1, op: conv2d, inputs: x, kernel: 3, padding: 1}\n", NULL, 8,
     "model.nodes[1].out_channels", "node `c1`: required key is missing"},
    {4, "    - {name: c2, op: conv2d, inputs: r1, out_channels: 4, kernel: 3, init: xavier}\n",
     NULL, 11, "model.nodes[4].init",
     "node `c2`: expected uniform or kaiming_normal, got 'xavier'"},
    {10, "    - {name: d, op: dropout, inputs: f, p: 1}\n", NULL, 17, "model.nodes[10].p",
     "node `d`: expected a number in [0, 1), got '1'"},
    {4, "    - {name: c2, op: conv2d, inputs: r1, out_channels: 4, kernel: 3, bias: 'no'}\n", NULL,
     11, "model.nodes[4].bias", "expected true or false"},
    {3, "    - {name: r1, op: relu, inputs: b1, kernel: 3}\n", NULL, 10, "model.nodes[3].kernel",
     "node `r1`: not used by op 'relu'"},
    {3, "    - {name: r1, op: relu, input: b1}\n", NULL, 10, "model.nodes[3].input",
     "node `r1`: unknown key (did you mean 'inputs'?)"},
    {3, "    - {name: r1, op: relu, inputs: b1, inputs: b1}\n", NULL, 10, "model.nodes[3].inputs",
     "duplicate key (first given at line 10)"},
    {3, "    - {name: 'r 1', op: relu, inputs: b1}\n", NULL, 10, "model.nodes[3].name",
     "expected a node name of 1 to 48 letters"},
    {3, "    - {op: relu, inputs: b1}\n", NULL, 10, "model.nodes[3].name",
     "required key is missing"},
    {3, "    - relu\n", NULL, 10, "model.nodes[3]", "expected a node: a mapping"},
    {-1, NULL, "    - {name: x2, op: input, shape: [1, 8, 8]}\n", 20, "model.nodes[13].op",
     "node `x2`: a second input node (the first is `x`)"},
    /* arity */
    {6, "    - {name: add, op: add, inputs: c2}\n", NULL, 13, "model.nodes[6].inputs",
     "node `add`: add takes 2 inputs, got 1"},
    {3, "    - {name: r1, op: relu}\n", NULL, 10, "model.nodes[3].inputs",
     "node `r1`: required key is missing (relu takes 1 input)"},
    /* shapes */
    {5, "    - {name: sc, op: conv2d, inputs: x, out_channels: 4, kernel: 1, stride: 2}\n", NULL,
     13, "model.nodes[6].inputs",
     "node `add`: input `c2` has shape [4,4,8,8], `sc` has [4,4,4,4] (shapes must be equal or "
     "broadcast)"},
    {8, "    - {name: cat, op: concat, inputs: [p, add], axis: 1}\n", NULL, 15,
     "model.nodes[8].inputs",
     "node `cat`: input `p` has shape [4,4,4,4], `add` has [4,4,8,8] (they must agree except "
     "along axis 1)"},
    {7, "    - {name: p, op: maxpool, inputs: add, kernel: 16}\n", NULL, 14,
     "model.nodes[7].kernel",
     "node `p`: kernel 16 with padding 0 does not fit input `add` of shape [4,4,8,8]"},
    {7, "    - {name: p, op: maxpool, inputs: add, kernel: 2, padding: 2}\n", NULL, 14,
     "model.nodes[7].padding", "padding 2 is more than half of kernel 2"},
    {9, "    - {name: f, op: reshape, inputs: cat, shape: [100]}\n", NULL, 16,
     "model.nodes[9].shape",
     "node `f`: input `cat` of shape [4,8,4,4] has 128 values per sample, which shape [100] "
     "cannot hold"},
    {2, "    - {name: b1, op: batchnorm2d, inputs: f}\n", NULL, 9, "model.nodes[2].inputs",
     "the graph has a cycle"},
    {11, "    - {name: fc, op: linear, inputs: d, out_features: 5}\n", NULL, 19,
     "model.nodes[12].inputs",
     "node `loss`: input `fc` has shape [4,5]; the loss takes logits [4,4] (batch, data.classes)"},
    {10, "    - {name: d, op: global_avgpool, inputs: f}\n", NULL, 17, "model.nodes[10].inputs",
     "node `d`: input `f` has shape [4,128]; global_avgpool takes 4 dims (N, C, H, W)"},
    {0, "    - {name: x, op: input, shape: [1, 8, 9]}\n", NULL, 7, "model.nodes[0].shape",
     "node `x`: shape [1,8,9] (72 values per sample) does not match the data: data.input_dim 64"},
    /* every node leads to the loss */
    {-1, NULL, "    - {name: extra, op: relu, inputs: x}\n", 20, "model.nodes[13]",
     "node `extra`: does not lead to the loss node `loss`"},
};

enum { N_ERR_CASES = sizeof(err_cases) / sizeof(err_cases[0]) };

/* The GPT nodes: shapes, attributes, and model.context / model.vocab from the tokens node. */
START_TEST(test_graphspec_gpt_parse)
{
    struct mge_jobspec *s = parse_ok(gpt_text(-1, NULL, NULL));
    const struct mge_graphspec *gs = s->model.graph;
    ck_assert(mge_graphspec_reads_tokens(gs));
    ck_assert(mge_model_reads_tokens(&s->model));
    ck_assert_str_eq(gs->nodes[gs->input].name, "idx");
    ck_assert_int_eq(s->model.context, 8);
    ck_assert_int_eq(s->model.vocab, 16);
    assert_shape(node(gs, "idx"), 2, (int64_t[]){2, 8});
    assert_shape(node(gs, "wte"), 3, (int64_t[]){2, 8, 12});
    assert_shape(node(gs, "wpe"), 3, (int64_t[]){2, 8, 12});
    assert_shape(node(gs, "qkv"), 3, (int64_t[]){2, 8, 36});
    assert_shape(node(gs, "attn"), 3, (int64_t[]){2, 8, 12});
    assert_shape(node(gs, "head"), 3, (int64_t[]){2, 8, 16});
    ck_assert_int_eq(node(gs, "head")->tied, 1);
    ck_assert_int_eq(node(gs, "wte")->tied, -1);
    ck_assert_int_eq(node(gs, "attn")->heads, 2);
    ck_assert_int_eq(node(gs, "qkv")->init, MGE_GINIT_NORMAL);
    ck_assert_int_eq(node(gs, "qkv")->residual_layers, 0);
    ck_assert_int_eq(node(gs, "proj")->residual_layers, 1);
    mge_jobspec_free(s);
    /* an image graph does not read tokens */
    s = parse_ok(graph_text(-1, NULL, NULL));
    ck_assert(!mge_graphspec_reads_tokens(s->model.graph));
    ck_assert(!mge_model_reads_tokens(&s->model));
    ck_assert_int_eq(node(s->model.graph, "fc")->init, MGE_GINIT_UNIFORM);
    mge_jobspec_free(s);
}
END_TEST

static const struct err_case gpt_err_cases[] = {
    /* vocab and context must agree with the tokens node and the input */
    {1, "    - {name: wte, op: embedding, inputs: idx, vocab: 17, d_model: 12}\n", NULL, 8,
     "model.nodes[1].vocab",
     "node `wte`: vocab 17 does not match the vocab of tokens node `idx` (16)"},
    {2, "    - {name: wpe, op: pos_embedding, inputs: wte, context: 9}\n", NULL, 9,
     "model.nodes[2].context",
     "node `wpe`: context 9, but input `wte` of shape [2,8,12] has 8 tokens per window"},
    {0, "    - {name: idx, op: tokens, context: 8, vocab: 1}\n", NULL, 7, "model.nodes[0].vocab",
     "node `idx`: expected an integer between 2 and 16777216, got '1'"},
    {1, "    - {name: wte, op: embedding, inputs: idx, vocab: 16}\n", NULL, 8,
     "model.nodes[1].d_model", "node `wte`: required key is missing"},
    /* wrong input ranks */
    {2, "    - {name: wpe, op: pos_embedding, inputs: flat, context: 8}\n",
     "    - {name: flat, op: flatten, inputs: wte}\n", 9, "model.nodes[2].inputs",
     "node `wpe`: input `flat` has shape [2,96]; pos_embedding takes 3 dims (N, context, d_model)"},
    {1, "    - {name: wte, op: embedding, inputs: e0, vocab: 16, d_model: 12}\n",
     "    - {name: e0, op: embedding, inputs: idx, vocab: 16, d_model: 12}\n", 8,
     "model.nodes[1].inputs",
     "node `wte`: input `e0` has shape [2,8,12]; embedding takes the token ids [batch, context] "
     "of a tokens node"},
    {3, "    - {name: ln, op: layernorm, inputs: idx}\n", NULL, 10, "model.nodes[3].inputs",
     "node `ln`: input `idx` holds token ids: only an embedding node reads them"},
    {4, "    - {name: qkv, op: linear, inputs: ln, out_features: 35, init: normal}\n", NULL, 12,
     "model.nodes[5].inputs",
     "node `attn`: input `qkv` has shape [2,8,35]; causal_attention takes 3 dims (N, T, 3 "
     "d_model)"},
    {5, "    - {name: attn, op: causal_attention, inputs: qkv, heads: 5}\n", NULL, 12,
     "model.nodes[5].heads",
     "node `attn`: d_model 12 (a third of input `qkv`'s last dim) is not a multiple of heads 5"},
    {8, "    - {name: head, op: relu, inputs: res}\n", NULL, 16, "model.nodes[9].inputs",
     "node `loss`: input `head` has shape [2,8,12]; the loss takes logits [2,8,16] (batch, "
     "context and vocab of tokens node `idx`)"},
    /* the tied output */
    {8, "    - {name: head, op: tied_linear, inputs: res, tied_to: ln}\n", NULL, 15,
     "model.nodes[8].tied_to",
     "node `head`: `ln` is a layernorm node, not an embedding: tied_to names the embedding"},
    {8, "    - {name: head, op: tied_linear, inputs: res, tied_to: nowhere}\n", NULL, 15,
     "model.nodes[8].tied_to", "node `head`: tied_to 'nowhere' is not a node of the graph"},
    {8, "    - {name: head, op: tied_linear, inputs: res}\n", NULL, 15, "model.nodes[8].tied_to",
     "node `head`: required key is missing (expected the name of an embedding node)"},
    {8, "    - {name: head, op: linear, inputs: res, out_features: 16, tied_to: wte}\n", NULL, 15,
     "model.nodes[8].tied_to", "node `head`: not used by op 'linear'"},
    {8,
     "    - {name: head0, op: tied_linear, inputs: res, tied_to: e2}\n"
     "    - {name: e2, op: embedding, inputs: idx, vocab: 16, d_model: 16}\n"
     "    - {name: head, op: add, inputs: [head0, e2]}\n",
     NULL, 15, "model.nodes[8].tied_to", "node `head0`: embedding `e2` does not run before"},
    {7, "    - {name: res, op: concat, inputs: [wpe, proj], axis: 2}\n", NULL, 15,
     "model.nodes[8].inputs",
     "node `head`: input `res` has shape [2,8,24]; the embedding `wte` it is tied to has d_model "
     "12"},
    /* linear's init */
    {6, "    - {name: proj, op: linear, inputs: attn, out_features: 12, residual_layers: 1}\n",
     NULL, 13, "model.nodes[6].residual_layers", "node `proj`: scales init normal"},
    {4, "    - {name: qkv, op: linear, inputs: ln, out_features: 36, init: kaiming_normal}\n", NULL,
     11, "model.nodes[4].init", "node `qkv`: expected uniform or normal, got 'kaiming_normal'"},
    /* one input node */
    {-1, NULL, "    - {name: x2, op: input, shape: [8]}\n", 17, "model.nodes[10].op",
     "node `x2`: a second input node (the first is `idx`)"},
};

enum { N_GPT_ERR_CASES = sizeof(gpt_err_cases) / sizeof(gpt_err_cases[0]) };

/* err_cases on graph_text, then gpt_err_cases on gpt_text */
START_TEST(test_graphspec_errors)
{
    bool gpt = _i >= N_ERR_CASES;
    const struct err_case *tc = gpt ? &gpt_err_cases[_i - N_ERR_CASES] : &err_cases[_i];
    char *text = gpt ? gpt_text(tc->replace, tc->with, tc->extra)
                     : graph_text(tc->replace, tc->with, tc->extra);
    assert_refused(_i, text, tc->line, tc->key, tc->msg);
}
END_TEST

/* Token ids come from data.format tokens or text, and only through op tokens. */
START_TEST(test_graphspec_gpt_data)
{
    char text[4096];
    /* op tokens on image data */
    snprintf(text, sizeof(text), "%s",
             graph_text(0, "    - {name: x, op: tokens, context: 8, vocab: 16}\n", NULL));
    assert_refused(0, text, 7, "model.nodes[0].op",
                   "node `x`: op tokens reads data.format tokens or text");
    /* op input on text */
    snprintf(text, sizeof(text), "%s",
             gpt_text(0, "    - {name: idx, op: input, shape: [8]}\n", NULL));
    assert_refused(
        1, text, 7, "model.nodes[0].op",
        "node `idx`: data.format tokens and text give token ids: read them with op tokens");
    /* windows are drawn by step */
    const char *gpt = gpt_text(-1, NULL, NULL), *at = strstr(gpt, "steps: 1");
    snprintf(text, sizeof(text), "%.*sepochs: 1%s", (int)(at - gpt), gpt, at + 8);
    ck_assert_ptr_nonnull(strstr(text, "train: {epochs: 1, batch_size"));
    assert_refused(
        2, text, 7, "model.nodes[0].op",
        "node `idx`: op tokens draws random windows: give train.steps, not train.epochs");
}
END_TEST

/* The model section's own rules for type graph. */
START_TEST(test_graphspec_model_keys)
{
    static const struct {
        const char *text;
        int line;
        const char *key, *msg;
    } cases[] = {
        {"name: g\nmodel: {type: graph}\ndata: {format: synthetic}\n"
         "train: {steps: 1, batch_size: 4, optimizer: {lr: 0.1}}\n",
         2, "model.nodes", "required key is missing (expected a list of 1 to 4096 nodes"},
        {"name: g\nmodel: {type: graph, nodes: []}\ndata: {format: synthetic}\n"
         "train: {steps: 1, batch_size: 4, optimizer: {lr: 0.1}}\n",
         2, "model.nodes", "expected a list of 1 to 4096 nodes ({name, op, inputs, ...}), got 0"},
        {"name: g\nmodel: {type: graph, nodes: [{name: x, op: input, shape: [4]}]}\n"
         "data: {format: synthetic}\ntrain: {steps: 1, batch_size: 4, optimizer: {lr: 0.1}}\n",
         2, "model.nodes", "no cross_entropy node"},
        {"name: g\nmodel: {type: graph, activation: gelu, nodes: [a]}\n", 2, "model.activation",
         "not used by model type 'graph'"},
        {"name: g\nmodel: {type: mlp, hidden: [4], nodes: [a]}\n", 2, "model.nodes",
         "not used by model type 'mlp'"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
        assert_refused((int)i, cases[i].text, cases[i].line, cases[i].key, cases[i].msg);
}
END_TEST

/* The canonical source and the JSON form (submitted again) give the same graph. */
static const struct {
    int gpt; /* gpt_text rather than graph_text */
    int n_nodes;
    const char *has[4]; /* in the JSON */
} round_trips[] = {
    {0, N_NODES, {"\"nodes\":[{\"name\":\"x\",\"op\":\"input\"", "\"init\":\"kaiming_normal\""}},
    {1,
     N_GPT_NODES,
     {"{\"name\":\"idx\",\"op\":\"tokens\",\"inputs\":[],\"vocab\":16,\"context\":8}",
      "\"tied_to\":\"wte\"", "\"init\":\"normal\",\"residual_layers\":1", "\"heads\":2"}},
};

START_TEST(test_graphspec_round_trip)
{
    const char *text = round_trips[_i].gpt ? gpt_text(-1, NULL, NULL) : graph_text(-1, NULL, NULL);
    struct mge_jobspec *s = parse_ok(text), *again, *from_json;
    char *j1 = mge_jobspec_to_json(s), *j2, *j3;
    ck_assert_ptr_nonnull(j1);
    for (int k = 0; k < 4 && round_trips[_i].has[k]; k++)
        ck_assert_msg(strstr(j1, round_trips[_i].has[k]), "%s lacks %s", j1,
                      round_trips[_i].has[k]);
    again = parse_ok(s->source);
    from_json = parse_ok(j1);
    j2 = mge_jobspec_to_json(again);
    j3 = mge_jobspec_to_json(from_json);
    ck_assert_str_eq(j1, j2);
    ck_assert_str_eq(j1, j3);
    ck_assert_int_eq(from_json->model.graph->n, round_trips[_i].n_nodes);
    ck_assert_int_eq(from_json->model.context, s->model.context); /* the tokens node's */
    mge_free(j1);
    mge_free(j2);
    mge_free(j3);
    mge_jobspec_free(s);
    mge_jobspec_free(again);
    mge_jobspec_free(from_json);
}
END_TEST

/* Other model types say "nodes": null. */
START_TEST(test_graphspec_json_null)
{
    struct mge_jobspec *s =
        parse_ok("name: m\nmodel: {type: mlp, hidden: [4]}\ndata: {format: synthetic}\n"
                 "train: {steps: 1, batch_size: 4, optimizer: {lr: 0.1}}\n");
    char *j1 = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(j1, "\"nodes\":null"));
    mge_free(j1);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_graphspec_alloc_failures)
{
    const char *text = _i ? gpt_text(-1, NULL, NULL) : graph_text(-1, NULL, NULL);
    long n;
    for (n = 0; n < 100000; n++) {
        struct mge_jobspec *s = NULL;
        struct mge_spec_error err;
        mge_alloc_fail_after(n);
        int rc = mge_jobspec_parse("job.yaml", text, strlen(text), NULL, 0, &s, &err);
        mge_alloc_fail_after(-1);
        if (rc == MGE_OK) {
            mge_jobspec_free(s);
            break;
        }
        ck_assert_msg(rc == MGE_NOMEM, "n=%ld: rc %d (%s)", n, rc, err.message);
        ck_assert_ptr_null(s);
    }
    ck_assert_int_gt(n, 10);
    ck_assert_int_lt(n, 100000);
}
END_TEST

/* The engine builds the nodes with PyTorch's parameter names, shapes and kinds. */
struct want_param {
    const char *name;
    int ndim;
    int64_t shape[4];
    int buffer;
};

/* The parameters of @g are @want, in order: names, shapes, buffer or not. */
static void assert_params(const struct mge_graph *g, const struct want_param *want, int n)
{
    ck_assert_int_eq(mge_graph_n_params(g), n);
    for (int i = 0; i < n; i++) {
        int v = mge_graph_param(g, i);
        ck_assert_str_eq(mge_value_name(g, v), want[i].name);
        ck_assert_int_eq(mge_value_ndim(g, v), want[i].ndim);
        for (int d = 0; d < want[i].ndim; d++)
            ck_assert_int_eq(mge_value_shape(g, v)[d], want[i].shape[d]);
        ck_assert_int_eq(mge_value_is_buffer(g, v), want[i].buffer);
    }
}

START_TEST(test_graphspec_build)
{
    struct mge_jobspec *s = parse_ok(graph_text(-1, NULL, NULL));
    struct mge_graph *g = NULL;
    struct mge_model m;
    static const struct want_param want[] = {
        {"c1.weight", 4, {4, 1, 3, 3}, 0},
        {"c1.bias", 1, {4}, 0},
        {"b1.weight", 1, {4}, 0},
        {"b1.bias", 1, {4}, 0},
        {"b1.running_mean", 1, {4}, 1},
        {"b1.running_var", 1, {4}, 1},
        {"c2.weight", 4, {4, 4, 3, 3}, 0},
        {"sc.weight", 4, {4, 1, 1, 1}, 0},
        {"sc.bias", 1, {4}, 0},
        {"fc.weight", 2, {4, 128}, 0},
        {"fc.bias", 1, {4}, 0},
    };
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, s, 4, 1, 8, 8, 4, &m), MGE_OK);
    assert_params(g, want, (int)(sizeof(want) / sizeof(want[0])));
    ck_assert_int_eq(mge_value_ndim(g, m.logits), 2);
    ck_assert_int_eq(mge_value_shape(g, m.logits)[1], 4);
    ck_assert_int_eq(mge_value_numel(g, m.loss), 1);
    ck_assert_int_eq(mge_graph_backward(g, m.loss), MGE_OK);
    mge_graph_free(g);

    /* the data the engine loads must be what the input declares (idx files say it here) */
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, s, 4, 1, 8, 9, 4, &m), MGE_INVAL);
    ck_assert_msg(strstr(mge_graph_error_msg(g), "model.nodes[0] (line 7): node `x`: the data's "
                                                 "samples are [1,8,9] (72 values), the input "
                                                 "declares 64 values"),
                  "%s", mge_graph_error_msg(g));
    mge_graph_free(g);
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, s, 4, 1, 8, 8, 7, &m), MGE_INVAL);
    ck_assert_msg(strstr(mge_graph_error_msg(g), "node `loss`: logits of 4 classes, the data "
                                                 "has 7"),
                  "%s", mge_graph_error_msg(g));
    mge_graph_free(g);
    mge_jobspec_free(s);
}
END_TEST

static int count_ops(const struct mge_graph *g, const char *op)
{
    int n = 0;
    for (int i = 0; i < mge_graph_n_nodes(g); i++)
        n += !strcmp(mge_graph_node_op(g, i, NULL), op);
    return n;
}

/* The GPT nodes build with nanoGPT's layout: one embedding table used twice (tied). */
START_TEST(test_graphspec_gpt_build)
{
    struct mge_jobspec *s = parse_ok(gpt_text(-1, NULL, NULL));
    struct mge_graph *g = NULL;
    struct mge_model m;
    static const struct want_param want[] = {
        {"wte.weight", 2, {16, 12}, 0},  {"wpe.weight", 2, {8, 12}, 0},  {"ln.weight", 1, {12}, 0},
        {"ln.bias", 1, {12}, 0},         {"qkv.weight", 2, {36, 12}, 0}, {"qkv.bias", 1, {36}, 0},
        {"proj.weight", 2, {12, 12}, 0}, {"proj.bias", 1, {12}, 0},
    };
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, s, 2, 0, 0, 0, 0, &m), MGE_OK);
    assert_params(g, want, (int)(sizeof(want) / sizeof(want[0])));
    ck_assert_int_eq(mge_value_ndim(g, m.x), 2);
    ck_assert_int_eq(mge_value_ndim(g, m.y), 2); /* the next token at each place */
    ck_assert_int_eq(mge_value_shape(g, m.y)[1], 8);
    ck_assert_int_eq(mge_value_ndim(g, m.logits), 3);
    ck_assert_int_eq(mge_value_shape(g, m.logits)[2], 16);
    ck_assert_int_eq(mge_graph_backward(g, m.loss), MGE_OK);
    mge_graph_free(g);
    mge_jobspec_free(s);
}
END_TEST

/* A linear followed by its only reader, an activation, runs as one fused op (as the zoo's). */
START_TEST(test_graphspec_build_fuses_activation)
{
    static const char text[] = GHEAD "    - {name: x, op: input, shape: [64]}\n"
                                     "    - {name: fc1, op: linear, inputs: x, out_features: 8}\n"
                                     "    - {name: act, op: gelu, inputs: fc1}\n"
                                     "    - {name: fc2, op: linear, inputs: act, out_features: 4}\n"
                                     "    - {name: loss, op: cross_entropy, inputs: fc2}\n";
    struct mge_jobspec *s = parse_ok(text);
    struct mge_graph *g = NULL;
    struct mge_model m;
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, s, 4, 1, 1, 64, 4, &m), MGE_OK);
    ck_assert_int_eq(count_ops(g, "UNARY"), 0);
    ck_assert_int_eq(count_ops(g, "LINEAR"), 2);
    mge_graph_free(g);
    mge_jobspec_free(s);
    /* an activation that does not follow a linear is an op of its own */
    s = parse_ok(GHEAD "    - {name: x, op: input, shape: [64]}\n"
                       "    - {name: act, op: gelu, inputs: x}\n"
                       "    - {name: fc2, op: linear, inputs: act, out_features: 4}\n"
                       "    - {name: loss, op: cross_entropy, inputs: fc2}\n");
    ck_assert_int_eq(mge_graph_new(&g), MGE_OK);
    ck_assert_int_eq(mge_model_build(g, s, 4, 1, 1, 64, 4, &m), MGE_OK);
    ck_assert_int_eq(count_ops(g, "UNARY"), 1);
    mge_graph_free(g);
    mge_jobspec_free(s);
}
END_TEST

static Suite *graphspec_suite(void)
{
    Suite *s = suite_create("graphspec");
    TCase *tc = tcase_create("parse");
    tcase_add_test(tc, test_graphspec_parse_and_shapes);
    tcase_add_test(tc, test_graphspec_order);
    tcase_add_test(tc, test_graphspec_reshape_and_broadcast);
    tcase_add_loop_test(tc, test_graphspec_round_trip, 0, 2);
    tcase_add_test(tc, test_graphspec_json_null);
    tcase_add_test(tc, test_graphspec_large);
    tcase_add_test(tc, test_graphspec_gpt_parse);
    suite_add_tcase(s, tc);
    tc = tcase_create("errors");
    tcase_add_loop_test(tc, test_graphspec_errors, 0, N_ERR_CASES + N_GPT_ERR_CASES);
    tcase_add_test(tc, test_graphspec_model_keys);
    tcase_add_test(tc, test_graphspec_gpt_data);
    tcase_add_loop_test(tc, test_graphspec_alloc_failures, 0, 2);
    suite_add_tcase(s, tc);
    tc = tcase_create("build");
    tcase_add_test(tc, test_graphspec_build);
    tcase_add_test(tc, test_graphspec_build_fuses_activation);
    tcase_add_test(tc, test_graphspec_gpt_build);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    return mge_test_run(graphspec_suite());
}
