/*
 * main_export.c: mge-export, a checkpoint's weights (parameters and buffers, not the optimiser
 * state) as a safetensors file with the parameter names of the equivalent PyTorch module.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/alloc.h"
#include "common/err.h"
#include "engine/ckpt.h"
#include "engine/model.h"
#include "engine/safetensors.h"

static void usage(FILE *fp)
{
    fprintf(fp, "usage: mge-export CKPT --format safetensors --output FILE\n"
                "Writes the parameters and buffers of checkpoint CKPT (not its optimiser state)\n"
                "to FILE as safetensors, named as PyTorch's equivalent module names them\n"
                "(fc1.weight, layer1.0.bn1.running_mean; batch norms also get PyTorch's\n"
                "num_batches_tracked): torch.nn.Module.load_state_dict(strict=True) reads them,\n"
                "and mge-train --init-from FILE starts from them.\n");
}

static int export_safetensors(const char *path, const char *out)
{
    struct mge_ckpt *ck = NULL;
    struct mge_ckpt_tensor *ts = NULL;
    char(*names)[160] = NULL;
    char err[768], step[32];
    int n = 0, code = 2;

    if (mge_ckpt_read(path, &ck, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "mge-export: %s\n", err);
        return 2;
    }
    /* room for a num_batches_tracked beside each batch norm's running statistics */
    ts = mge_calloc(2 * (size_t)ck->n_tensors + 1, sizeof(*ts));
    names = mge_calloc(2 * (size_t)ck->n_tensors + 1, sizeof(*names));
    if (!ts || !names) {
        fprintf(stderr, "mge-export: %s: out of memory\n", path);
        code = 1;
        goto out;
    }
    for (int i = 0; i < ck->n_tensors; i++) {
        const struct mge_ckpt_tensor *t = &ck->tensors[i];
        if (!strncmp(t->name, "optim.", 6))
            continue; /* optimiser state: "optim.<state>.<param>" */
        if (t->dtype != MGE_CKPT_F32) {
            fprintf(stderr, "mge-export: %s: tensor '%s' is not float32\n", path, t->name);
            goto out;
        }
        ts[n] = *t;
        ts[n].name = mge_model_torch_name(t->name, names[n], sizeof(names[n]));
        n++;
        /* PyTorch's BatchNorm2d also counts its training batches (int64), and a strict
         * load_state_dict wants the counter; mge's fixed momentum needs none: write the step */
        size_t len = strlen(t->name), sfx = strlen(".running_var");
        if (len > sfx && !strcmp(t->name + len - sfx, ".running_var")) {
            snprintf(names[n], sizeof(names[n]), "%.*s.num_batches_tracked", (int)(len - sfx),
                     t->name);
            ts[n] = (struct mge_ckpt_tensor){names[n], MGE_CKPT_I64, 0,
                                             {0},      &ck->step,    sizeof(ck->step)};
            n++;
        }
    }
    snprintf(step, sizeof(step), "%lld", (long long)ck->step);
    const char *meta[] = {
        "format", "pt", "mge.step", step, "mge.spec", ck->spec_yaml ? ck->spec_yaml : "", NULL};
    if (mge_safetensors_write(out, ts, n, meta, err, sizeof(err)) != MGE_OK) {
        fprintf(stderr, "mge-export: %s\n", err);
        goto out;
    }
    code = 0;
out:
    mge_free(names);
    mge_free(ts);
    mge_ckpt_free(ck);
    return code;
}

int main(int argc, char **argv)
{
    const char *path = NULL, *format = NULL, *out = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--format") && i + 1 < argc) {
            format = argv[++i];
        } else if (!strcmp(argv[i], "--output") && i + 1 < argc) {
            out = argv[++i];
        } else if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        } else if (argv[i][0] == '-' || path) {
            fprintf(stderr, "mge-export: unexpected argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            path = argv[i];
        }
    }
    if (!path || !format || !out) {
        usage(stderr);
        return 2;
    }
    if (strcmp(format, "safetensors") != 0) {
        fprintf(stderr, "mge-export: --format: unknown format '%s' (known: safetensors)\n", format);
        return 2;
    }
    return export_safetensors(path, out);
}
