/*
 * fuzz_graphspec.c: libFuzzer target for model.nodes (common/graphspec.c), what strangers POST
 * as a graph model. The input is the value of `nodes:` under a fixed spec, so every run
 * exercises the graph reader rather than the rest of the spec; an input that starts with
 * "# text" gets a spec of text data instead (token windows: the GPT nodes). Beyond "no crash, no
 * leak": a graph that parses must come back the same from its canonical source and from its JSON,
 * its order must put every node after its inputs, and every shape must be positive.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/graphspec.h"
#include "common/jobspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char HEAD[] = "name: fuzz\n"
                           "data: {format: synthetic, image: [1, 8, 8], classes: 4}\n"
                           "train: {steps: 1, batch_size: 4, optimizer: {lr: 0.1}}\n"
                           "model:\n"
                           "  type: graph\n"
                           "  nodes: ";
static const char HEAD_TEXT[] = "name: fuzz\n"
                                "data: {format: text, train_files: [t.txt]}\n"
                                "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n"
                                "model:\n"
                                "  type: graph\n"
                                "  nodes: ";

static void check_order(const struct mge_graphspec *gs)
{
    int *pos = calloc((size_t)gs->n, sizeof(int));
    if (!pos)
        return;
    for (int k = 0; k < gs->n; k++) {
        if (gs->order[k] < 0 || gs->order[k] >= gs->n || pos[gs->order[k]])
            abort(); /* not a permutation */
        pos[gs->order[k]] = k + 1;
    }
    for (int i = 0; i < gs->n; i++) {
        const struct mge_gnode *nd = &gs->nodes[i];
        for (int j = 0; j < nd->n_inputs; j++)
            if (pos[nd->inputs[j]] >= pos[i])
                abort(); /* an input runs after its reader */
        for (int d = 0; d < nd->out_ndim; d++)
            if (nd->out_shape[d] < 1)
                abort();
    }
    free(pos);
}

static void check_spec(struct mge_jobspec *spec)
{
    struct mge_jobspec *again = NULL, *from_json = NULL;
    struct mge_spec_error err;
    char *a = mge_jobspec_to_json(spec), *b = NULL, *c = NULL;

    if (!a)
        abort();
    if (spec->model.type != MGE_MODEL_GRAPH || !spec->model.graph)
        abort();
    check_order(spec->model.graph);
    if (mge_jobspec_parse("source", spec->source, strlen(spec->source), NULL, 0, &again, &err))
        abort(); /* the canonical source of a valid spec must be valid */
    if (mge_jobspec_parse("json", a, strlen(a), NULL, 0, &from_json, &err))
        abort(); /* and so must its JSON, submitted again */
    b = mge_jobspec_to_json(again);
    c = mge_jobspec_to_json(from_json);
    if (!b || !c || strcmp(a, b) != 0 || strcmp(a, c) != 0)
        abort();
    mge_free(a);
    mge_free(b);
    mge_free(c);
    mge_jobspec_free(again);
    mge_jobspec_free(from_json);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    bool tokens = size >= 6 && !memcmp(data, "# text", 6);
    const char *h = tokens ? HEAD_TEXT : HEAD;
    size_t head = strlen(h);
    char *text;

    if (size > 65536)
        return 0;
    text = malloc(head + size);
    if (!text)
        return 0;
    memcpy(text, h, head);
    memcpy(text + head, data, size);
    if (mge_jobspec_parse("fuzz.yaml", text, head + size, NULL, 0, &spec, &err) == MGE_OK)
        check_spec(spec);
    mge_jobspec_free(spec);
    free(text);
    return 0;
}
