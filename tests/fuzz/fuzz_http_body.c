/*
 * fuzz_http_body.c: libFuzzer target for job submission bodies as POST /api/v1/jobs parses
 * them (content type, size and NUL checks, JSON check, the shared YAML spec validator).
 * The first input byte picks the content type; the rest is the body. An optional "\n--\n"
 * separator splits off one --set override from the end.
 */
#include <jansson.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/alloc.h"
#include "common/jobspec.h"
#include "coordinator/http_api.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static const char *const types[] = {"application/yaml", "application/json", "text/yaml",
                                        "application/x-yaml; charset=utf-8", "text/plain", NULL};
    struct mge_jobspec *spec = NULL;
    json_t *problem = NULL;
    const char *ovr[1];
    int n_ovr = 0, status = 0;
    char *body, *sep;
    size_t len;

    if (size < 1)
        return 0;
    body = mge_malloc(size);
    if (!body)
        return 0;
    memcpy(body, data + 1, size - 1);
    body[size - 1] = '\0';
    len = size - 1;
    sep = len >= 4 ? memmem(body, len, "\n--\n", 4) : NULL;
    if (sep && !memchr(sep + 4, '\0', len - (size_t)(sep + 4 - body))) {
        ovr[0] = sep + 4;
        n_ovr = 1;
        len = (size_t)(sep - body);
    }
    mge_http_parse_job(types[data[0] % 6], body, len, n_ovr ? ovr : NULL, n_ovr, &spec, &problem,
                       &status);
    mge_jobspec_free(spec);
    json_decref(problem);
    mge_free(body);
    return 0;
}
