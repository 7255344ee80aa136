/*
 * fuzz_jobspec.c: libFuzzer target for the job spec reader (what strangers POST to the
 * coordinator). Beyond "no crash, no leak": a spec that parses must come back equal from its
 * own canonical source, and must turn into JSON.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_spec(struct mge_jobspec *spec)
{
    struct mge_jobspec *again = NULL;
    struct mge_spec_error err;
    char *a, *b;

    if (mge_jobspec_parse("source", spec->source, strlen(spec->source), NULL, 0, &again, &err))
        abort(); /* the canonical source of a valid spec must be valid */
    if (strcmp(spec->source, again->source) != 0)
        abort(); /* and a fixed point */
    a = mge_jobspec_to_json(spec);
    b = mge_jobspec_to_json(again);
    if (!a || !b || strcmp(a, b) != 0)
        abort();
    (void)mge_jobspec_total_steps(spec, 60000);
    mge_free(a);
    mge_free(b);
    mge_jobspec_free(again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const overrides[] = {"train.steps=10", "model.hidden=[16, 8]"};
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;

    if (mge_jobspec_parse("fuzz.yaml", (const char *)data, size, NULL, 0, &spec, &err) == MGE_OK)
        check_spec(spec);
    mge_jobspec_free(spec);
    spec = NULL;
    if (mge_jobspec_parse("fuzz.yaml", (const char *)data, size, overrides, 2, &spec, &err) ==
        MGE_OK)
        check_spec(spec);
    mge_jobspec_free(spec);
    return 0;
}
