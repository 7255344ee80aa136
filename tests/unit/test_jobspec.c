/* test_jobspec.c: Check suite for common/jobspec.c: parsing, defaults, every kind of error,
 * --set overrides, the canonical source round trip, JSON, and allocation failures. */
#include <check.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/alloc.h"
#include "common/err.h"
#include "common/jobspec.h"
#include "engine/data.h"
#include "tests/unit/support/check_run.h"

/* Every key set to a value other than its default. */
static const char FULL_IDX[] = "name: full-spec_1.0\n"
                               "model:\n"
                               "  type: mlp\n"
                               "  hidden: [300, 100]\n"
                               "  activation: tanh\n"
                               "  dropout: 0.25\n"
                               "data:\n"
                               "  format: idx\n"
                               "  train_images: /data/train-images.gz\n"
                               "  train_labels: /data/train-labels.gz\n"
                               "  test_images: /data/test-images.gz\n"
                               "  test_labels: /data/test-labels.gz\n"
                               "  prefetch: 4\n"
                               "train:\n"
                               "  epochs: 7\n"
                               "  batch_size: 64\n"
                               "  optimizer:\n"
                               "    type: adamw\n"
                               "    lr: 0.001\n"
                               "    weight_decay: 0.05\n"
                               "    beta1: 0.8\n"
                               "    beta2: 0.99\n"
                               "    eps: 1e-6\n"
                               "  lr_schedule:\n"
                               "    type: cosine\n"
                               "    warmup_steps: 100\n"
                               "    min_lr: 1e-5\n"
                               "  seed: 7\n"
                               "  checkpoint_every: 250\n"
                               "  log_every: 10\n"
                               "  eval: false\n"
                               "resources:\n"
                               "  device: gpu\n"
                               "  workers: {min: 2, max: 4}\n"
                               "  cpus: 8\n"
                               "  gpus: 2\n"
                               "  memory_mb: 16384\n"
                               "memory:\n"
                               "  sublinear: light\n"
                               "  budget_mb: 2048\n"
                               "distributed:\n"
                               "  backend: nccl\n"
                               "  pack_mb: 25\n"
                               "  deterministic: true\n"
                               "  micro_shards: 6\n"
                               "priority: -5\n";

/* The other branches: synthetic data, deep_mlp, sgd with nesterov, step schedule, flow style. */
static const char FULL_SYNTH[] =
    "name: synth\n"
    "model: {type: deep_mlp, layers: 16, width: 256, activation: gelu}\n"
    "data: {format: synthetic, train_size: 1000, test_size: 100, classes: 5, image: [3, 8, 8],\n"
    "       prefetch: 0}\n"
    "train:\n"
    "  steps: 50\n"
    "  batch_size: 32\n"
    "  optimizer: {type: sgd, lr: 0.1, momentum: 0.5, nesterov: true, weight_decay: 1e-4}\n"
    "  lr_schedule: {type: step, step_size: 10, gamma: 0.5}\n"
    "resources: {workers: 4}\n"
    "memory: {sublinear: true}\n"
    "distributed: {backend: mpi}\n";

/* Lines 1-11 of most error cases below; line numbers in the tests count from here. */
#define HEAD                                                                                       \
    "name: t\n"             /* 1 */                                                                \
    "model:\n"              /* 2 */                                                                \
    "  type: mlp\n"         /* 3 */                                                                \
    "  hidden: [8]\n"       /* 4 */                                                                \
    "data:\n"               /* 5 */                                                                \
    "  format: synthetic\n" /* 6 */
#define TRAIN                                                                                      \
    "train:\n"          /* 7 */                                                                    \
    "  epochs: 1\n"     /* 8 */                                                                    \
    "  batch_size: 4\n" /* 9 */                                                                    \
    "  optimizer:\n"    /* 10 */                                                                   \
    "    lr: 0.1\n"     /* 11 */

static const char MINIMAL[] = HEAD TRAIN;

static struct mge_jobspec *parse_ok(const char *text, const char *const *ov, int n_ov)
{
    struct mge_jobspec *spec = NULL;
    struct mge_spec_error err;
    int rc = mge_jobspec_parse("job.yaml", text, strlen(text), ov, n_ov, &spec, &err);
    ck_assert_msg(rc == MGE_OK, "rc %d: %s", rc, err.message);
    ck_assert_ptr_nonnull(spec);
    return spec;
}

static int parse_err(const char *text, const char *const *ov, int n_ov, struct mge_spec_error *err)
{
    struct mge_jobspec *spec = (struct mge_jobspec *)&spec; /* poison: must come back NULL */
    int rc = mge_jobspec_parse("job.yaml", text, strlen(text), ov, n_ov, &spec, err);
    ck_assert_int_ne(rc, MGE_OK);
    ck_assert_ptr_null(spec);
    ck_assert_str_eq(err->file, "job.yaml");
    ck_assert_msg(strncmp(err->message, "job.yaml", 8) == 0, "message '%s'", err->message);
    return rc;
}

static int str_eq(const char *a, const char *b)
{
    return (!a && !b) || (a && b && !strcmp(a, b));
}

/* Field by field, so a new field that the source loses shows up here. */
static void assert_spec_eq(const struct mge_jobspec *a, const struct mge_jobspec *b)
{
    ck_assert(str_eq(a->name, b->name));
    ck_assert_int_eq(a->model.type, b->model.type);
    ck_assert_int_eq(a->model.n_hidden, b->model.n_hidden);
    ck_assert(!memcmp(a->model.hidden, b->model.hidden, sizeof(a->model.hidden)));
    ck_assert_int_eq(a->model.activation, b->model.activation);
    ck_assert_int_eq(a->model.layers, b->model.layers);
    ck_assert_int_eq(a->model.width, b->model.width);
    ck_assert(a->model.dropout == b->model.dropout);
    ck_assert(a->model.heads == b->model.heads && a->model.d_model == b->model.d_model &&
              a->model.context == b->model.context && a->model.vocab == b->model.vocab); /* gpt */
    ck_assert(a->data.token_bytes == b->data.token_bytes &&
              a->data.test_fraction == b->data.test_fraction &&
              a->data.n_train_files == b->data.n_train_files &&
              str_eq(a->data.test_file, b->data.test_file));
    ck_assert_int_eq(a->data.format, b->data.format);
    ck_assert(str_eq(a->data.train_images, b->data.train_images));
    ck_assert(str_eq(a->data.train_labels, b->data.train_labels));
    ck_assert(str_eq(a->data.test_images, b->data.test_images));
    ck_assert(str_eq(a->data.test_labels, b->data.test_labels));
    ck_assert_int_eq(a->data.train_size, b->data.train_size);
    ck_assert_int_eq(a->data.test_size, b->data.test_size);
    ck_assert_int_eq(a->data.input_dim, b->data.input_dim);
    ck_assert_int_eq(a->data.classes, b->data.classes);
    ck_assert_int_eq(a->data.image_h, b->data.image_h);
    ck_assert_int_eq(a->data.image_w, b->data.image_w);
    ck_assert_int_eq(a->data.channels, b->data.channels);
    ck_assert_int_eq(a->data.prefetch, b->data.prefetch);
    ck_assert_int_eq(a->model.variant, b->model.variant);
    ck_assert_int_eq(a->model.stem_cifar, b->model.stem_cifar);
    ck_assert_int_eq(a->data.aug_crop_padding, b->data.aug_crop_padding);
    ck_assert_int_eq(a->data.aug_hflip, b->data.aug_hflip);
    ck_assert_int_eq(a->train.epochs, b->train.epochs);
    ck_assert_int_eq(a->train.steps, b->train.steps);
    ck_assert_int_eq(a->train.batch_size, b->train.batch_size);
    ck_assert_int_eq(a->train.optim.type, b->train.optim.type);
    ck_assert(a->train.optim.lr == b->train.optim.lr);
    ck_assert(a->train.optim.momentum == b->train.optim.momentum);
    ck_assert_int_eq(a->train.optim.nesterov, b->train.optim.nesterov);
    ck_assert(a->train.optim.weight_decay == b->train.optim.weight_decay);
    ck_assert(a->train.optim.beta1 == b->train.optim.beta1);
    ck_assert(a->train.optim.beta2 == b->train.optim.beta2);
    ck_assert(a->train.optim.eps == b->train.optim.eps);
    ck_assert_int_eq(a->train.sched.type, b->train.sched.type);
    ck_assert_int_eq(a->train.sched.step_size, b->train.sched.step_size);
    ck_assert(a->train.sched.gamma == b->train.sched.gamma);
    ck_assert_int_eq(a->train.sched.warmup_steps, b->train.sched.warmup_steps);
    ck_assert(a->train.sched.min_lr == b->train.sched.min_lr);
    ck_assert(a->train.seed == b->train.seed);
    ck_assert_int_eq(a->train.checkpoint_every, b->train.checkpoint_every);
    ck_assert_int_eq(a->train.log_every, b->train.log_every);
    ck_assert_int_eq(a->train.eval_every_epoch, b->train.eval_every_epoch);
    ck_assert(a->train.clip_grad_norm == b->train.clip_grad_norm);
    ck_assert(a->train.label_smoothing == b->train.label_smoothing);
    ck_assert_int_eq(a->train.precision, b->train.precision);
    ck_assert_int_eq(a->train.optim.no_decay_1d, b->train.optim.no_decay_1d);
    ck_assert_int_eq(a->resources.device, b->resources.device);
    ck_assert_int_eq(a->resources.workers_min, b->resources.workers_min);
    ck_assert_int_eq(a->resources.workers_max, b->resources.workers_max);
    ck_assert_int_eq(a->resources.cpus, b->resources.cpus);
    ck_assert_int_eq(a->resources.gpus, b->resources.gpus);
    ck_assert_int_eq(a->resources.memory_mb, b->resources.memory_mb);
    ck_assert_int_eq(a->memory.sublinear, b->memory.sublinear);
    ck_assert_int_eq(a->memory.budget_mb, b->memory.budget_mb);
    ck_assert_int_eq(a->distributed.backend, b->distributed.backend);
    ck_assert(a->distributed.pack_mb == b->distributed.pack_mb);
    ck_assert_int_eq(a->distributed.deterministic, b->distributed.deterministic);
    ck_assert_int_eq(a->distributed.micro_shards, b->distributed.micro_shards);
    ck_assert_int_eq(a->priority, b->priority);
}

/* ---- parse ---- */

START_TEST(test_jobspec_parse_full_idx)
{
    struct mge_jobspec *s = parse_ok(FULL_IDX, NULL, 0);
    ck_assert_str_eq(s->name, "full-spec_1.0");
    ck_assert_int_eq(s->model.type, MGE_MODEL_MLP);
    ck_assert_int_eq(s->model.n_hidden, 2);
    ck_assert_int_eq(s->model.hidden[0], 300);
    ck_assert_int_eq(s->model.hidden[1], 100);
    ck_assert_int_eq(s->model.activation, MGE_ACT_TANH);
    ck_assert_float_eq(s->model.dropout, 0.25f);
    ck_assert_int_eq(s->data.format, MGE_DATA_IDX);
    ck_assert_str_eq(s->data.train_images, "/data/train-images.gz");
    ck_assert_str_eq(s->data.train_labels, "/data/train-labels.gz");
    ck_assert_str_eq(s->data.test_images, "/data/test-images.gz");
    ck_assert_str_eq(s->data.test_labels, "/data/test-labels.gz");
    ck_assert_int_eq(s->data.prefetch, 4);
    ck_assert_int_eq(s->train.epochs, 7);
    ck_assert_int_eq(s->train.steps, 0);
    ck_assert_int_eq(s->train.batch_size, 64);
    ck_assert_int_eq(s->train.optim.type, MGE_OPTIM_ADAMW);
    ck_assert_double_eq(s->train.optim.lr, 0.001);
    ck_assert_double_eq(s->train.optim.weight_decay, 0.05);
    ck_assert_double_eq(s->train.optim.beta1, 0.8);
    ck_assert_double_eq(s->train.optim.beta2, 0.99);
    ck_assert_double_eq(s->train.optim.eps, 1e-6);
    ck_assert_int_eq(s->train.sched.type, MGE_SCHED_COSINE);
    ck_assert_int_eq(s->train.sched.warmup_steps, 100);
    ck_assert_double_eq(s->train.sched.min_lr, 1e-5);
    ck_assert_uint_eq(s->train.seed, 7);
    ck_assert_int_eq(s->train.checkpoint_every, 250);
    ck_assert_int_eq(s->train.log_every, 10);
    ck_assert_int_eq(s->train.eval_every_epoch, 0);
    ck_assert_int_eq(s->resources.device, MGE_DEVICE_GPU);
    ck_assert_int_eq(s->resources.workers_min, 2);
    ck_assert_int_eq(s->resources.workers_max, 4);
    ck_assert_int_eq(s->resources.cpus, 8);
    ck_assert_int_eq(s->resources.gpus, 2);
    ck_assert_int_eq(s->resources.memory_mb, 16384);
    ck_assert_int_eq(s->memory.sublinear, MGE_SUBLINEAR_LIGHT);
    ck_assert_int_eq(s->memory.budget_mb, 2048);
    ck_assert_int_eq(s->distributed.backend, MGE_BACKEND_NCCL);
    ck_assert_double_eq(s->distributed.pack_mb, 25);
    ck_assert_int_eq(s->distributed.deterministic, 1);
    ck_assert_int_eq(s->distributed.micro_shards, 6);
    ck_assert_int_eq(s->priority, -5);
    ck_assert_ptr_nonnull(s->source);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_parse_full_synthetic)
{
    struct mge_jobspec *s = parse_ok(FULL_SYNTH, NULL, 0);
    ck_assert_int_eq(s->model.type, MGE_MODEL_DEEP_MLP);
    ck_assert_int_eq(s->model.layers, 16);
    ck_assert_int_eq(s->model.width, 256);
    ck_assert_int_eq(s->model.activation, MGE_ACT_GELU);
    ck_assert_int_eq(s->data.format, MGE_DATA_SYNTHETIC);
    ck_assert_ptr_null(s->data.train_images);
    ck_assert_int_eq(s->data.train_size, 1000);
    ck_assert_int_eq(s->data.test_size, 100);
    ck_assert_int_eq(s->data.classes, 5);
    ck_assert_int_eq(s->data.channels, 3);
    ck_assert_int_eq(s->data.image_h, 8);
    ck_assert_int_eq(s->data.image_w, 8);
    ck_assert_int_eq(s->data.input_dim, 3 * 8 * 8);
    ck_assert_int_eq(s->data.prefetch, 0);
    ck_assert_int_eq(s->distributed.micro_shards, 12); /* default: batch 32, workers 4 */
    ck_assert_int_eq(s->train.epochs, 0);
    ck_assert_int_eq(s->train.steps, 50);
    ck_assert_int_eq(s->train.optim.type, MGE_OPTIM_SGD);
    ck_assert_double_eq(s->train.optim.momentum, 0.5);
    ck_assert_int_eq(s->train.optim.nesterov, 1);
    ck_assert_double_eq(s->train.optim.weight_decay, 1e-4);
    ck_assert_int_eq(s->train.sched.type, MGE_SCHED_STEP);
    ck_assert_int_eq(s->train.sched.step_size, 10);
    ck_assert_double_eq(s->train.sched.gamma, 0.5);
    ck_assert_int_eq(s->resources.workers_min, 4);
    ck_assert_int_eq(s->resources.workers_max, 4);
    ck_assert_int_eq(s->memory.sublinear, MGE_SUBLINEAR_ON);
    ck_assert_int_eq(s->distributed.backend, MGE_BACKEND_MPI);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_parse_json_body)
{
    /* JSON is YAML: the REST API takes either. */
    static const char body[] =
        "{\"name\": \"j\", \"model\": {\"type\": \"lenet\"},"
        " \"data\": {\"format\": \"synthetic\", \"image\": [1, 32, 32]},"
        " \"train\": {\"epochs\": 2, \"batch_size\": 16, \"optimizer\": {\"lr\": 0.01}}}";
    struct mge_jobspec *s = parse_ok(body, NULL, 0);
    ck_assert_int_eq(s->model.type, MGE_MODEL_LENET);
    ck_assert_int_eq(s->data.input_dim, 1024);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_defaults)
{
    struct mge_jobspec *s = parse_ok(MINIMAL, NULL, 0);
    ck_assert_int_eq(s->model.activation, MGE_ACT_RELU);
    ck_assert_int_eq(s->model.layers, 128);
    ck_assert_int_eq(s->model.width, 1024);
    ck_assert_float_eq(s->model.dropout, 0);
    ck_assert_int_eq(s->data.train_size, 60000);
    ck_assert_int_eq(s->data.test_size, 10000);
    ck_assert_int_eq(s->data.input_dim, 784);
    ck_assert_int_eq(s->data.classes, 10);
    ck_assert_int_eq(s->data.channels, 1);
    ck_assert_int_eq(s->data.image_h, 28);
    ck_assert_int_eq(s->data.image_w, 28);
    ck_assert_int_eq(s->data.prefetch, 2);
    ck_assert_int_eq(s->train.optim.type, MGE_OPTIM_SGD);
    ck_assert_double_eq(s->train.optim.momentum, 0);
    ck_assert_int_eq(s->train.optim.nesterov, 0);
    ck_assert_double_eq(s->train.optim.weight_decay, 0);
    ck_assert_double_eq(s->train.optim.beta1, 0.9);
    ck_assert_double_eq(s->train.optim.beta2, 0.999);
    ck_assert_double_eq(s->train.optim.eps, 1e-8);
    ck_assert_int_eq(s->train.sched.type, MGE_SCHED_CONSTANT);
    ck_assert_uint_eq(s->train.seed, 42);
    ck_assert_int_eq(s->train.checkpoint_every, 0);
    ck_assert_int_eq(s->train.checkpoint_every_sec, 0);
    ck_assert_int_eq(s->train.log_every, 1);
    ck_assert_int_eq(s->train.eval_every_epoch, 1);
    ck_assert_double_eq(s->train.clip_grad_norm, 0); /* off */
    ck_assert_double_eq(s->train.label_smoothing, 0);
    ck_assert_int_eq(s->train.optim.no_decay_1d, 0); /* decay_1d: true */
    ck_assert_int_eq(s->resources.device, MGE_DEVICE_CPU);
    ck_assert_int_eq(s->resources.workers_min, 1);
    ck_assert_int_eq(s->resources.workers_max, 1);
    ck_assert_int_eq(s->resources.cpus, 1);
    ck_assert_int_eq(s->resources.gpus, 0);
    ck_assert_int_eq(s->resources.memory_mb, 0);
    ck_assert_int_eq(s->memory.sublinear, MGE_SUBLINEAR_OFF);
    ck_assert_int_eq(s->memory.budget_mb, 0);
    ck_assert_int_eq(s->distributed.backend, MGE_BACKEND_AUTO);
    ck_assert_double_eq(s->distributed.pack_mb, 10);
    ck_assert_int_eq(s->distributed.deterministic, 0);
    ck_assert_int_eq(s->distributed.micro_shards, 4); /* 12, capped by batch_size 4 */
    ck_assert_int_eq(s->priority, 0);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_precision)
{
    struct mge_jobspec *s = parse_ok(HEAD TRAIN "  precision: bf16\n", NULL, 0);
    ck_assert_int_eq(s->train.precision, MGE_PRECISION_BF16);
    char *json = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(json, "\"precision\":\"bf16\""));
    mge_free(json);
    mge_jobspec_free(s);
    static const char *const ov[] = {"train.precision=fp32"};
    s = parse_ok(HEAD TRAIN "  precision: bf16\n", ov, 1);
    ck_assert_int_eq(s->train.precision, MGE_PRECISION_FP32);
    mge_jobspec_free(s);
}
END_TEST

/* data.classes: the spec takes exactly what the engine can build (one limit, MGE_CLASSES_MAX). */
START_TEST(test_jobspec_clip_smoothing_decay)
{
    struct mge_jobspec *s = parse_ok(HEAD TRAIN "    type: adamw\n    decay_1d: false\n"
                                                "  clip_grad_norm: 1.5\n  label_smoothing: 0.1\n",
                                     NULL, 0);
    ck_assert_double_eq(s->train.clip_grad_norm, 1.5);
    ck_assert_double_eq(s->train.label_smoothing, 0.1);
    ck_assert_int_eq(s->train.optim.no_decay_1d, 1);
    ck_assert_int_eq(s->train.precision, MGE_PRECISION_FP32); /* the default */
    char *json = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(json, "\"clip_grad_norm\":1.5"));
    ck_assert_ptr_nonnull(strstr(json, "\"decay_1d\":false"));
    mge_free(json);
    mge_jobspec_free(s);
}
END_TEST

/* train.eager: off by default, true parsed and exported (the coordinator keeps the spec's JSON) */
START_TEST(test_jobspec_eager)
{
    struct mge_jobspec *s = parse_ok(HEAD TRAIN "    type: sgd\n", NULL, 0);
    ck_assert_int_eq(s->train.eager, 0);
    mge_jobspec_free(s);
    s = parse_ok(HEAD TRAIN "    type: sgd\n  eager: true\n", NULL, 0);
    ck_assert_int_eq(s->train.eager, 1);
    char *json = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(json, "\"eager\":true"));
    mge_free(json);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_classes_limit_is_the_engines)
{
    struct mge_spec_error err;
    struct mge_dataset ds;
    struct mge_jobspec *s = parse_ok("name: t\nmodel: {type: mlp, hidden: []}\n"
                                     "data: {format: synthetic, classes: 65536}\n"
                                     "train: {epochs: 1, batch_size: 4, optimizer: {lr: 0.1}}\n",
                                     NULL, 0);
    ck_assert_int_eq(s->data.classes, MGE_CLASSES_MAX);
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 4, 1, 1, 2, s->data.classes, 1), MGE_OK);
    ck_assert_int_eq(ds.classes, MGE_CLASSES_MAX);
    mge_dataset_fini(&ds);
    mge_jobspec_free(s);
    ck_assert_int_eq(mge_dataset_synthetic(&ds, 4, 1, 1, 2, MGE_CLASSES_MAX + 1, 1), MGE_INVAL);
    ck_assert_int_eq(parse_err("name: t\nmodel: {type: mlp, hidden: []}\n"
                               "data: {format: synthetic, classes: 65537}\n"
                               "train: {epochs: 1, batch_size: 4, optimizer: {lr: 0.1}}\n",
                               NULL, 0, &err),
                     MGE_SPEC);
    ck_assert_str_eq(err.key, "data.classes");
    ck_assert_int_eq(err.line, 3);
}
END_TEST

START_TEST(test_jobspec_defaults_dependent)
{
    /* gpus defaults to 1 on gpu; adamw's weight decay to 0.01; null means "not given". */
    struct mge_jobspec *s = parse_ok(HEAD "train:\n  epochs: 1\n  batch_size: 4\n"
                                          "  optimizer: {type: adamw, lr: 0.1, eps: ~}\n"
                                          "resources: {device: gpu}\nmemory:\n",
                                     NULL, 0);
    ck_assert_int_eq(s->resources.gpus, 1);
    ck_assert_double_eq(s->train.optim.weight_decay, 0.01);
    ck_assert_double_eq(s->train.optim.eps, 1e-8);
    ck_assert_int_eq(s->memory.sublinear, MGE_SUBLINEAR_OFF);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_device_sim)
{
    /* the engine's simulated accelerator: no GPUs, shown by name in the JSON form */
    struct mge_jobspec *s = parse_ok(HEAD TRAIN "resources: {device: sim, workers: 2}\n", NULL, 0);
    ck_assert_int_eq(s->resources.device, MGE_DEVICE_SIM);
    ck_assert_int_eq(s->resources.gpus, 0);
    char *json = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(json, "\"device\":\"sim\""));
    mge_free(json);
    mge_jobspec_free(s);
}
END_TEST

/* ---- errors: exact code, line, key and a piece of the message ---- */

struct err_case {
    const char *text;
    int rc, line;
    const char *key, *msg;
};

static const struct err_case err_cases[] = {
    /* malformed YAML */
    {"name: [x\nmodel: {\n", MGE_FORMAT, 2, "", "job.yaml:2:6: did not find expected ',' or ']'"},
    {"name: x\n\tmodel: 1\n", MGE_FORMAT, 2, "", "tab character"},
    {"a: 'unterminated\n", MGE_FORMAT, 2, "", "found unexpected end of stream"},
    {"name: \xff\n", MGE_FORMAT, 1, "", "invalid leading UTF-8 octet"},
    /* unknown keys, with and without a suggestion */
    {HEAD TRAIN "  optimiser: {}\n", MGE_SPEC, 12, "train.optimiser",
     "job.yaml:12: train.optimiser: unknown key (did you mean 'optimizer'?)"},
    {HEAD TRAIN "colour: red\n", MGE_SPEC, 12, "colour", "job.yaml:12: colour: unknown key"},
    {HEAD TRAIN "    learning_rate: 1\n", MGE_SPEC, 12, "train.optimizer.learning_rate",
     "unknown key"},
    /* wrong types */
    {HEAD "train:\n  epochs: 1\n  batch_size: 4\n  optimizer:\n    lr: fast\n", MGE_SPEC, 11,
     "train.optimizer.lr", "job.yaml:11: train.optimizer.lr: expected a number > 0, got 'fast'"},
    {HEAD "train:\n  epochs: 1\n  batch_size: 4\n  optimizer:\n    lr: '0.1'\n", MGE_SPEC, 11,
     "train.optimizer.lr", "got a quoted string '0.1' (write it without quotes)"},
    {HEAD "train:\n  epochs: 1.5\n  batch_size: 4\n  optimizer:\n    lr: 0.1\n", MGE_SPEC, 8,
     "train.epochs", "expected an integer between 1 and 1000000, got '1.5'"},
    {HEAD TRAIN "  eval: yes\n", MGE_SPEC, 12, "train.eval", "expected true or false, got 'yes'"},
    {HEAD TRAIN "  checkpoint_every_sec: 30s\n", MGE_SPEC, 12, "train.checkpoint_every_sec",
     "expected an integer between 0 and 31536000, got '30s'"},
    {HEAD TRAIN "  checkpoint_every_sec: -1\n", MGE_SPEC, 12, "train.checkpoint_every_sec",
     "expected an integer between 0 and 31536000, got '-1'"},
    {HEAD TRAIN "model: 3\n", MGE_SPEC, 12, "model", "duplicate key"},
    {"name: t\nmodel: [mlp]\n", MGE_SPEC, 2, "model", "expected a mapping, got a list"},
    {"name: t\nmodel:\n  type: mpl\n", MGE_SPEC, 3, "model.type",
     "expected one of mlp, lenet, deep_mlp, resnet, graph, gpt, got 'mpl' (did you mean 'mlp'?)"},
    {"name: t\nmodel:\n  type: resnet\n  depth: 21\n", MGE_SPEC, 4, "model.depth",
     "expected 6n+2 (8, 14, 20, 32, 44, 56, 110: CIFAR-style basic blocks, n per stage), got 21"},
    {"name: t\nmodel:\n  type: resnet\n  depth: 2\n", MGE_SPEC, 4, "model.depth",
     "expected an integer between 8 and 1202, got '2'"},
    {"name: t\nmodel:\n  type: resnet\n  width: 0\n", MGE_SPEC, 4, "model.width",
     "expected an integer between 1 and 4096, got '0'"},
    {"name: t\nmodel:\n  type: resnet\n  variant: resnet19\n", MGE_SPEC, 4, "model.variant",
     "expected one of cifar, resnet18, resnet34, resnet50, resnet101, resnet152, got 'resnet19'"},
    {"name: t\nmodel:\n  type: resnet\n  variant: resnet50\n  depth: 50\n", MGE_SPEC, 5,
     "model.depth", "not used with a torchvision variant"},
    {"name: t\nmodel:\n  type: resnet\n  stem: imagenet\n", MGE_SPEC, 4, "model.stem",
     "only for the torchvision variants"},
    {"name: t\nmodel:\n  type: resnet\n  variant: resnet18\n  stem: tiny\n", MGE_SPEC, 5,
     "model.stem", "expected one of imagenet, cifar, got 'tiny'"},
    {"name: t\nmodel:\n  type: lenet\n  variant: resnet18\n", MGE_SPEC, 4, "model.variant",
     "not used by model type 'lenet'"},
    {"name: t\nmodel:\n  type: mlp\n  hidden: 512\n", MGE_SPEC, 4, "model.hidden",
     "expected a list of 0 to 64 integers, got '512'"},
    {"name: t\nmodel:\n  type: mlp\n  hidden: [512,\n    x]\n", MGE_SPEC, 5, "model.hidden",
     "item 2: expected an integer between 1 and 1048576, got 'x'"},
    {"name: my job\n", MGE_SPEC, 1, "name", "expected 1 to 128 letters"},
    /* out of range */
    {HEAD "train:\n  epochs: 1\n  batch_size: 0\n  optimizer:\n    lr: 0.1\n", MGE_SPEC, 9,
     "train.batch_size", "expected an integer between 1 and 16777216, got '0'"},
    {HEAD "train:\n  epochs: 1\n  batch_size: 4\n  optimizer:\n    lr: -1\n", MGE_SPEC, 11,
     "train.optimizer.lr", "expected a number > 0, got '-1'"},
    {HEAD TRAIN "    momentum: 1\n", MGE_SPEC, 12, "train.optimizer.momentum",
     "expected a number in [0, 1), got '1'"},
    {HEAD TRAIN "priority: 101\n", MGE_SPEC, 12, "priority",
     "expected an integer between -100 and 100, got '101'"},
    {HEAD TRAIN "  seed: 99999999999999999999999\n", MGE_SPEC, 12, "train.seed",
     "expected an integer >= 0"},
    {HEAD TRAIN "    lr: .inf\n", MGE_SPEC, 12, "train.optimizer.lr", "duplicate key"},
    {HEAD "train:\n  epochs: 1\n  batch_size: 4\n  optimizer:\n    lr: .inf\n", MGE_SPEC, 11,
     "train.optimizer.lr", "expected a number > 0, got '.inf'"},
    /* missing required keys: the line is the parent's */
    {HEAD "train:\n  epochs: 1\n  optimizer:\n    lr: 0.1\n", MGE_SPEC, 7, "train.batch_size",
     "job.yaml:7: train.batch_size: required key is missing"},
    {"model: {type: mlp}\n", MGE_SPEC, 0, "name", "job.yaml: name: required key is missing"},
    {"name: t\nmodel:\n  hidden: [1]\n", MGE_SPEC, 2, "model.type", "required key is missing"},
    {"name: t\nmodel:\n  type:\n", MGE_SPEC, 3, "model.type", "got an empty value"},
    {HEAD "train:\n  epochs: 1\n  batch_size: 4\n", MGE_SPEC, 7, "train.optimizer",
     "required key is missing"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: idx\n  train_images: a\n", MGE_SPEC,
     3, "data.train_labels", "required key is missing"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata: {format: idx, train_images: a,\n"
     "  train_labels: b,\n  test_images: c}\n",
     MGE_SPEC, 5, "data.test_images", "needs data.test_labels too"},
    /* epochs and steps: exactly one */
    {HEAD TRAIN "  steps: 10\n", MGE_SPEC, 12, "train.steps",
     "cannot be given together with train.epochs (line 8)"},
    {HEAD "train:\n  batch_size: 4\n  optimizer:\n    lr: 0.1\n", MGE_SPEC, 7, "train",
     "one of 'epochs' or 'steps' is required"},
    /* workers: N or {min, max} */
    {HEAD TRAIN "resources:\n  workers: {min: 4, max: 2}\n", MGE_SPEC, 13, "resources.workers.max",
     "expected an integer >= resources.workers.min (4), got '2'"},
    {HEAD TRAIN "resources:\n  workers: {min: 1, maxx: 2}\n", MGE_SPEC, 13,
     "resources.workers.maxx", "unknown key (did you mean 'max'?)"},
    {HEAD TRAIN "resources:\n  workers: {min: 2}\n", MGE_SPEC, 13, "resources.workers.max",
     "required key is missing"},
    {HEAD TRAIN "resources:\n  workers: 0\n", MGE_SPEC, 13, "resources.workers",
     "expected an integer between 1 and 4096, or {min: N, max: M}, got '0'"},
    {HEAD TRAIN "resources:\n  workers: 8\n", MGE_SPEC, 9, "train.batch_size",
     "at least resources.workers (8)"},
    /* keys that the chosen type does not use, and cross-field rules */
    {"name: t\nmodel:\n  type: lenet\n  hidden: [1]\n", MGE_SPEC, 4, "model.hidden",
     "not used by model type 'lenet'"},
    {"name: t\nmodel:\n  type: mlp\n  hidden: [1]\n  layers: 3\n", MGE_SPEC, 5, "model.layers",
     "not used by model type 'mlp'"},
    {"name: t\nmodel:\n  type: mlp\n  hidden: [1]\n  depth: 20\n", MGE_SPEC, 5, "model.depth",
     "not used by model type 'mlp'"},
    {"name: t\nmodel:\n  type: resnet\n  layers: 3\n", MGE_SPEC, 4, "model.layers",
     "not used by model type 'resnet'"},
    {HEAD TRAIN "    type: adam\n    momentum: 0.9\n", MGE_SPEC, 13, "train.optimizer.momentum",
     "not used by optimizer type 'adam'"},
    {HEAD TRAIN "    nesterov: true\n", MGE_SPEC, 12, "train.optimizer.nesterov",
     "needs momentum > 0"},
    /* clipping, label smoothing, decay of 1-D parameters */
    {HEAD TRAIN "  clip_grad_norm: 0\n", MGE_SPEC, 12, "train.clip_grad_norm",
     "job.yaml:12: train.clip_grad_norm: expected a number > 0, got '0'"},
    {HEAD TRAIN "  clip_grad_norm: -1\n", MGE_SPEC, 12, "train.clip_grad_norm",
     "expected a number > 0, got '-1'"},
    {HEAD TRAIN "  clip_grad_norm: big\n", MGE_SPEC, 12, "train.clip_grad_norm",
     "expected a number > 0, got 'big'"},
    {HEAD TRAIN "  label_smoothing: 1\n", MGE_SPEC, 12, "train.label_smoothing",
     "job.yaml:12: train.label_smoothing: expected a number in [0, 1), got '1'"},
    {HEAD TRAIN "  label_smoothing: -0.1\n", MGE_SPEC, 12, "train.label_smoothing",
     "expected a number in [0, 1), got '-0.1'"},
    {HEAD TRAIN "  precision: fp16\n", MGE_SPEC, 12, "train.precision",
     "job.yaml:12: train.precision: expected one of fp32, bf16"},
    {HEAD TRAIN "  precision: [bf16]\n", MGE_SPEC, 12, "train.precision",
     "expected one of fp32, bf16"},
    {HEAD TRAIN "    decay_1d: no\n", MGE_SPEC, 12, "train.optimizer.decay_1d",
     "job.yaml:12: train.optimizer.decay_1d: expected true or false, got 'no'"},
    {HEAD TRAIN "  label_smothing: 0.1\n", MGE_SPEC, 12, "train.label_smothing",
     "unknown key (did you mean 'label_smoothing'?)"},
    {HEAD TRAIN "  lr_schedule: {type: step}\n", MGE_SPEC, 12, "train.lr_schedule.step_size",
     "required key is missing"},
    {HEAD TRAIN "  lr_schedule: {type: cosine, min_lr: 0.5}\n", MGE_SPEC, 12,
     "train.lr_schedule.min_lr", "expected a number in [0, 0.1], got '0.5'"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: synthetic\n  train_images: x\n",
     MGE_SPEC, 5, "data.train_images", "only used with data.format idx"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: synthetic\n  classes: 65537\n",
     MGE_SPEC, 5, "data.classes",
     "job.yaml:5: data.classes: expected an integer between 2 and "
     "65536, got '65537'"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: synthetic\n  classes: 1000000\n",
     MGE_SPEC, 5, "data.classes", "expected an integer between 2 and 65536, got '1000000'"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: npy\n  train_size: 3\n", MGE_SPEC,
     5, "data.train_size", "only used with data.format synthetic (npy files carry their own)"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: npy\n  train_labels: y.npy\n",
     MGE_SPEC, 3, "data.train_images", "required key is missing"},
    {"name: t\nmodel: {type: mlp, hidden: []}\ndata:\n  format: idx\n  classes: 3\n", MGE_SPEC, 5,
     "data.classes", "only used with data.format synthetic"},
    {"name: t\nmodel: {type: lenet}\ndata:\n  format: synthetic\n  image: [3, 32, 32]\n"
     "  input_dim: 784\n",
     MGE_SPEC, 6, "data.input_dim", "expected c*h*w of data.image (3072), got '784'"},
    {HEAD TRAIN "resources: {gpus: 1}\n", MGE_SPEC, 12, "resources.gpus",
     "expected 0 with resources.device cpu, got '1'"},
    {HEAD TRAIN "distributed: {backend: nccl}\n", MGE_SPEC, 12, "distributed.backend",
     "with resources.device cpu, got 'nccl'"},
    {HEAD TRAIN "resources: {device: sim, gpus: 1}\n", MGE_SPEC, 12, "resources.gpus",
     "expected 0 with resources.device sim, got '1'"},
    {HEAD TRAIN "resources: {device: sim}\ndistributed: {backend: nccl}\n", MGE_SPEC, 13,
     "distributed.backend", "with resources.device sim, got 'nccl'"},
    {"name: t\nmodel: {type: mlp, hidden: [2]}\ndata: {format: synthetic}\n"
     "train: {epochs: 1, batch_size: 8, optimizer: {lr: 1}}\n"
     "resources: {workers: 2}\ndistributed:\n  backend: local\n",
     MGE_SPEC, 7, "distributed.backend", "when resources.workers is more than 1"},
    {HEAD TRAIN "distributed: {deterministic: yes}\n", MGE_SPEC, 12, "distributed.deterministic",
     "expected true or false, got 'yes'"},
    {HEAD TRAIN "distributed: {micro_shards: 0}\n", MGE_SPEC, 12, "distributed.micro_shards",
     "expected an integer between 1 and 1048576, got '0'"},
    {HEAD TRAIN "distributed: {deterministic: true, micro_shards: 5}\n", MGE_SPEC, 12,
     "distributed.micro_shards", "and train.batch_size (4)"},
    {"name: t\nmodel: {type: mlp, hidden: [2]}\ndata: {format: synthetic}\n"
     "train: {epochs: 1, batch_size: 64, optimizer: {lr: 1}}\n"
     "resources: {workers: {min: 1, max: 3}}\ndistributed:\n  deterministic: true\n"
     "  micro_shards: 2\n",
     MGE_SPEC, 8, "distributed.micro_shards", "between resources.workers max (3)"},
    /* document-level */
    {"", MGE_SPEC, 0, "name", "required key is missing"},
    {"- a\n- b\n", MGE_SPEC, 1, "", "expected a mapping of keys"},
    {HEAD TRAIN "---\nname: u\n", MGE_SPEC, 12, "", "one YAML document"},
    {"name: &n t\nmodel: *n\n", MGE_SPEC, 2, "", "aliases (*n) are not supported"},
    {"name: !!str t\n", MGE_SPEC, 1, "", "tags (tag:yaml.org,2002:str) are not supported"},
    {"? [a, b]\n: c\n", MGE_SPEC, 1, "", "expected a key name, got a list"},
};

START_TEST(test_jobspec_errors)
{
    const struct err_case *tc = &err_cases[_i];
    struct mge_spec_error err;
    int rc = parse_err(tc->text, NULL, 0, &err);
    ck_assert_msg(rc == tc->rc, "case %d: rc %d, want %d (%s)", _i, rc, tc->rc, err.message);
    ck_assert_msg(err.line == tc->line, "case %d: line %d, want %d (%s)", _i, err.line, tc->line,
                  err.message);
    ck_assert_msg(!strcmp(err.key, tc->key), "case %d: key '%s', want '%s' (%s)", _i, err.key,
                  tc->key, err.message);
    ck_assert_msg(strstr(err.message, tc->msg), "case %d: message '%s' lacks '%s'", _i, err.message,
                  tc->msg);
}
END_TEST

START_TEST(test_jobspec_error_column_and_null_err)
{
    struct mge_spec_error err;
    struct mge_jobspec *spec = NULL;
    parse_err(HEAD "train:\n  epochs: 1\n  batch_size: 4\n  optimizer:\n    lr: fast\n", NULL, 0,
              &err);
    ck_assert_int_eq(err.column, 9);
    /* @err may be NULL */
    ck_assert_int_eq(mge_jobspec_parse("x", "name: [", 7, NULL, 0, &spec, NULL), MGE_FORMAT);
    ck_assert_ptr_null(spec);
}
END_TEST

START_TEST(test_jobspec_error_too_big)
{
    size_t n = (1u << 20) + 1;
    char *big = malloc(n);
    struct mge_spec_error err;
    struct mge_jobspec *spec = NULL;
    memset(big, '#', n);
    ck_assert_int_eq(mge_jobspec_parse("big", big, n, NULL, 0, &spec, &err), MGE_SPEC);
    ck_assert_ptr_null(spec);
    free(big);
}
END_TEST

START_TEST(test_jobspec_error_deep_nesting)
{
    char text[4096];
    size_t n = 0;
    struct mge_spec_error err;
    n += (size_t)sprintf(text, "name: ");
    for (int i = 0; i < 1000; i++)
        text[n++] = '[';
    text[n] = '\0';
    /* Unclosed: libyaml reports it; closed or not, we must not recurse 1000 deep. */
    ck_assert_int_ne(parse_err(text, NULL, 0, &err), MGE_OK);
    for (int i = 0; i < 1000; i++)
        text[n++] = ']';
    text[n] = '\0';
    ck_assert_int_eq(parse_err(text, NULL, 0, &err), MGE_SPEC);
    ck_assert(strstr(err.message, "nested deeper"));
}
END_TEST

/* ---- overrides ---- */

START_TEST(test_jobspec_override_number)
{
    const char *ov[] = {"train.optimizer.lr=0.5", "train.batch_size=32"};
    struct mge_jobspec *s = parse_ok(MINIMAL, ov, 2);
    ck_assert_double_eq(s->train.optim.lr, 0.5);
    ck_assert_int_eq(s->train.batch_size, 32);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_override_list_and_string)
{
    const char *ov[] = {"model.hidden=[256,256]", "name=other-name", "name=last.wins"};
    struct mge_jobspec *s = parse_ok(MINIMAL, ov, 3);
    ck_assert_int_eq(s->model.n_hidden, 2);
    ck_assert_int_eq(s->model.hidden[0], 256);
    ck_assert_int_eq(s->model.hidden[1], 256);
    ck_assert_str_eq(s->name, "last.wins");
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_override_creates_keys)
{
    /* memory: is absent from MINIMAL and workers becomes a mapping. */
    const char *ov[] = {"memory.budget_mb=512", "resources.workers={min: 2, max: 4}",
                        "train.lr_schedule.type=cosine"};
    struct mge_jobspec *s = parse_ok(MINIMAL, ov, 3);
    ck_assert_int_eq(s->memory.budget_mb, 512);
    ck_assert_int_eq(s->resources.workers_min, 2);
    ck_assert_int_eq(s->resources.workers_max, 4);
    ck_assert_int_eq(s->train.sched.type, MGE_SCHED_COSINE);
    ck_assert_ptr_nonnull(strstr(s->source, "budget_mb: 512"));
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_override_steps_clears_epochs)
{
    const char *to_steps[] = {"train.steps=200"};
    const char *to_epochs[] = {"train.epochs=3"};
    struct mge_jobspec *s = parse_ok(MINIMAL, to_steps, 1), *back;
    ck_assert_int_eq(s->train.steps, 200);
    ck_assert_int_eq(s->train.epochs, 0);
    ck_assert_ptr_null(strstr(s->source, "epochs"));
    back = parse_ok(s->source, to_epochs, 1);
    ck_assert_int_eq(back->train.steps, 0);
    ck_assert_int_eq(back->train.epochs, 3);
    mge_jobspec_free(back);
    mge_jobspec_free(s);
}
END_TEST

START_TEST(test_jobspec_override_errors)
{
    static const struct {
        const char *ov, *key, *msg;
        int rc;
    } cases[] = {
        {"train.epochz=1", "train.epochz",
         "job.yaml: --set train.epochz=1: unknown key (did you mean 'epochs'?)", MGE_SPEC},
        {"trian.epochs=1", "trian", "--set trian.epochs=1: trian: unknown key", MGE_SPEC},
        {"train.epochs.x=1", "train.epochs.x", "unknown key (train.epochs takes a value, not keys)",
         MGE_SPEC},
        {"train.optimizer.lr=fast", "train.optimizer.lr",
         "job.yaml: --set train.optimizer.lr=fast: expected a number > 0, got 'fast'", MGE_SPEC},
        {"model.hidden=[1,2", "", "--set model.hidden=[1,2: malformed value", MGE_FORMAT},
        {"no-equals", "", "--set no-equals: expected key.path=value", MGE_SPEC},
        {"=1", "", "expected key.path=value", MGE_SPEC},
        {"train..lr=1", "", "expected key.path=value", MGE_SPEC},
        {"model.hidden.0=1", "model.hidden.0", "unknown key", MGE_SPEC},
        {"train.epochs=", "train", "one of 'epochs' or 'steps' is required", MGE_SPEC},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct mge_spec_error err;
        const char *ov[] = {cases[i].ov};
        int rc = parse_err(MINIMAL, ov, 1, &err);
        ck_assert_msg(rc == cases[i].rc, "%s: rc %d (%s)", cases[i].ov, rc, err.message);
        ck_assert_msg(!strcmp(err.key, cases[i].key), "%s: key '%s' (%s)", cases[i].ov, err.key,
                      err.message);
        ck_assert_msg(strstr(err.message, cases[i].msg), "%s: message '%s'", cases[i].ov,
                      err.message);
        if (strcmp(cases[i].ov, "train.epochs=") != 0)
            ck_assert_int_eq(err.line, 0);
    }
}
END_TEST

START_TEST(test_jobspec_override_not_a_mapping)
{
    const char *ov[] = {"resources.workers.max=4"};
    struct mge_spec_error err;
    parse_err(HEAD TRAIN "resources:\n  workers: 2\n", ov, 1, &err);
    ck_assert_str_eq(err.key, "resources.workers");
    ck_assert_ptr_nonnull(strstr(err.message, "is not a mapping (see line 13)"));
}
END_TEST

/* ---- canonical source, JSON, load, total steps ---- */

static void check_round_trip(const char *text, const char *const *ov, int n_ov)
{
    struct mge_jobspec *a = parse_ok(text, ov, n_ov);
    struct mge_jobspec *b = parse_ok(a->source, NULL, 0);
    struct mge_jobspec *j;
    char *json = mge_jobspec_to_json(a);

    assert_spec_eq(a, b);
    ck_assert_str_eq(a->source, b->source); /* canonical: a fixed point */
    ck_assert_ptr_nonnull(json);
    j = parse_ok(json, NULL, 0); /* the JSON form is a spec too */
    assert_spec_eq(a, j);
    mge_free(json);
    mge_jobspec_free(j);
    mge_jobspec_free(b);
    mge_jobspec_free(a);
}

START_TEST(test_jobspec_round_trip)
{
    const char *ov[] = {"train.steps=9", "data.prefetch=3"};
    check_round_trip(FULL_IDX, NULL, 0);
    check_round_trip(FULL_SYNTH, NULL, 0);
    check_round_trip(MINIMAL, NULL, 0);
    check_round_trip(MINIMAL, ov, 1);
    check_round_trip(FULL_IDX, ov + 1, 1);
    check_round_trip(HEAD TRAIN "    type: adamw\n    decay_1d: false\n  clip_grad_norm: 1.5\n"
                                "  label_smoothing: 0.1\n",
                     NULL, 0);
    /* Paths may hold anything; quoted ones must stay strings ('123', 'null'). */
    check_round_trip("name: p\nmodel: {type: mlp, hidden: [4]}\n"
                     "data: {format: idx, train_images: '#odd: path, [x]',\n"
                     "       train_labels: \"tab\\there\", test_images: '123',"
                     " test_labels: 'null'}\n" TRAIN,
                     NULL, 0);
}
END_TEST

START_TEST(test_jobspec_npy)
{
    static const char *const npy_img =
        "name: n\nmodel: {type: lenet}\n"
        "data: {format: npy, train_images: /d/x.npy, train_labels: /d/y.npy,\n"
        "       test_images: /d/tx.npy, test_labels: /d/ty.npy, image: [1, 28, 28],"
        " classes: 12}\n" TRAIN;
    static const char *const npy_plain = "name: n\nmodel: {type: mlp, hidden: [4]}\n"
                                         "data: {format: npy, train_images: /d/x.npy,"
                                         " train_labels: /d/y.npy}\n" TRAIN;
    struct mge_jobspec *s = parse_ok(npy_img, NULL, 0);
    char *text;
    json_t *j, *d;
    ck_assert_int_eq(s->data.format, MGE_DATA_NPY);
    ck_assert_str_eq(s->data.train_images, "/d/x.npy");
    ck_assert_str_eq(s->data.test_labels, "/d/ty.npy");
    ck_assert_int_eq(s->data.classes, 12);
    ck_assert_int_eq(s->data.image_given, 1);
    ck_assert_int_eq(s->data.input_dim_given, 0);
    ck_assert_int_eq(s->data.input_dim, 784);
    text = mge_jobspec_to_json(s);
    j = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(j);
    d = json_object_get(j, "data");
    ck_assert_str_eq(json_string_value(json_object_get(d, "format")), "npy");
    ck_assert(json_is_null(json_object_get(d, "input_dim")));
    ck_assert(json_is_null(json_object_get(d, "train_size")));
    ck_assert_int_eq(json_array_size(json_object_get(d, "image")), 3);
    json_decref(j);
    mge_free(text);
    mge_jobspec_free(s);
    check_round_trip(npy_img, NULL, 0);

    s = parse_ok(npy_plain, NULL, 0);
    ck_assert_int_eq(s->data.image_given, 0);
    ck_assert_int_eq(s->data.classes, 10);
    text = mge_jobspec_to_json(s);
    j = json_loads(text, 0, NULL);
    ck_assert(json_is_null(json_object_get(json_object_get(j, "data"), "image")));
    json_decref(j);
    mge_free(text);
    mge_jobspec_free(s);
    check_round_trip(npy_plain, NULL, 0);
}
END_TEST

START_TEST(test_jobspec_cifar)
{
    static const char *const c10 = "name: c\nmodel: {type: lenet}\n"
                                   "data:\n  format: cifar\n"
                                   "  train_files: [/d/data_batch_1.bin, /d/data_batch_2.bin]\n"
                                   "  test_file: /d/test_batch.bin\n" TRAIN;
    struct mge_jobspec *s = parse_ok(c10, NULL, 0);
    struct mge_spec_error err;
    ck_assert_int_eq(s->data.format, MGE_DATA_CIFAR);
    ck_assert_int_eq(s->data.n_train_files, 2);
    ck_assert_str_eq(s->data.train_files[1], "/d/data_batch_2.bin");
    ck_assert_str_eq(s->data.test_file, "/d/test_batch.bin");
    ck_assert_int_eq(s->data.classes, 10);
    ck_assert_int_eq(s->data.channels, 3);
    ck_assert_int_eq(s->data.image_h, 32);
    ck_assert_int_eq(s->data.input_dim, 3072);
    char *text = mge_jobspec_to_json(s);
    json_t *j = json_loads(text, 0, NULL);
    json_t *d = json_object_get(j, "data");
    ck_assert_str_eq(json_string_value(json_object_get(d, "format")), "cifar");
    ck_assert_int_eq(json_array_size(json_object_get(d, "train_files")), 2);
    ck_assert_str_eq(json_string_value(json_object_get(d, "test_file")), "/d/test_batch.bin");
    json_decref(j);
    mge_free(text);
    mge_jobspec_free(s);
    check_round_trip(c10, NULL, 0);
    check_round_trip("name: c\nmodel: {type: mlp, hidden: [8]}\n"
                     "data: {format: cifar, train_files: [train.bin], classes: 100}\n" TRAIN,
                     NULL, 0);

    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: cifar\n"
              "  train_files: [a.bin]\n  classes: 50\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.classes");
    ck_assert_ptr_nonnull(strstr(err.message, "10 (CIFAR-10) or 100 (CIFAR-100)"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: cifar\n"
              "  train_files: [a.bin]\n  image: [1, 28, 28]\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.image");
    ck_assert_ptr_nonnull(strstr(err.message, "not used with data.format cifar"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: cifar\n"
              "  train_files: []\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.train_files");
    ck_assert_int_eq(err.line, 5);
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: cifar\n"
              "  train_files: [a.bin, [x]]\n" TRAIN,
              NULL, 0, &err);
    ck_assert_ptr_nonnull(strstr(err.message, "item 2: expected a string"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: npy\n"
              "  train_files: [a.bin]\n" TRAIN,
              NULL, 0, &err);
    ck_assert_ptr_nonnull(strstr(err.message, "only used with data.format cifar"));
}
END_TEST

/* gpt on tokens or text: defaults, the JSON form, and what does not fit together. */
START_TEST(test_jobspec_gpt)
{
#define GPT_TRAIN "train: {steps: 10, batch_size: 4, optimizer: {type: adamw, lr: 0.001}}\n"
    static const char *const text = "name: g\nmodel: {type: gpt}\n"
                                    "data: {format: text, train_files: [a.txt, b.txt]}\n" GPT_TRAIN;
    struct mge_jobspec *s = parse_ok(text, NULL, 0);
    struct mge_spec_error err;
    ck_assert_int_eq(s->model.type, MGE_MODEL_GPT);
    ck_assert_int_eq(s->model.layers, 4);
    ck_assert_int_eq(s->model.heads, 4);
    ck_assert_int_eq(s->model.d_model, 128);
    ck_assert_int_eq(s->model.context, 128);
    ck_assert_int_eq(s->model.vocab, 256);
    ck_assert_int_eq(s->data.format, MGE_DATA_TEXT);
    ck_assert_int_eq(s->data.token_bytes, 1);
    ck_assert(s->data.test_fraction == 0.1);
    ck_assert_int_eq(s->data.n_train_files, 2);
    char *js = mge_jobspec_to_json(s);
    json_t *j = json_loads(js, 0, NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(j, "model"), "d_model")),
                     128);
    ck_assert(json_is_null(json_object_get(json_object_get(j, "data"), "dtype")));
    json_decref(j);
    mge_free(js);
    mge_jobspec_free(s);
    check_round_trip(text, NULL, 0);
    static const char *const tokens =
        "name: g\nmodel: {type: gpt, layers: 2, heads: 2, d_model: 64, context: 32, vocab: 50257}\n"
        "data: {format: tokens, dtype: uint32, train_files: [t.bin], test_file: v.bin}\n" GPT_TRAIN;
    s = parse_ok(tokens, NULL, 0);
    ck_assert_int_eq(s->data.token_bytes, 4);
    ck_assert_str_eq(s->data.test_file, "v.bin");
    mge_jobspec_free(s);
    check_round_trip(tokens, NULL, 0);

    parse_err("name: g\nmodel: {type: gpt, d_model: 100, heads: 3}\n"
              "data: {format: text, train_files: [a]}\n" GPT_TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "model.d_model");
    ck_assert_ptr_nonnull(strstr(err.message, "a multiple of model.heads (3)"));
    parse_err("name: g\nmodel: {type: gpt}\ndata:\n  format: idx\n  train_images: a\n"
              "  train_labels: b\n" GPT_TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.format");
    ck_assert_int_eq(err.line, 4);
    ck_assert_ptr_nonnull(strstr(err.message, "model type gpt reads data.format tokens or text"));
    parse_err("name: g\nmodel: {type: mlp, hidden: [4]}\n"
              "data: {format: tokens, train_files: [a]}\n" GPT_TRAIN,
              NULL, 0, &err);
    ck_assert_ptr_nonnull(strstr(err.message, "tokens and text are for model type gpt"));
    parse_err("name: g\nmodel: {type: gpt}\ndata: {format: text, train_files: [a]}\n" TRAIN, NULL,
              0, &err);
    ck_assert_str_eq(err.key, "train.epochs");
    parse_err("name: g\nmodel: {type: gpt}\ndata: {format: text, train_files: [a], dtype: "
              "uint16}\n" GPT_TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.dtype");
    parse_err("name: g\nmodel: {type: gpt}\n"
              "data: {format: tokens, train_files: [a], dtype: int8}\n" GPT_TRAIN,
              NULL, 0, &err);
    ck_assert_ptr_nonnull(strstr(err.message, "uint16, uint32"));
    parse_err(
        "name: g\nmodel: {type: gpt}\n"
        "data: {format: text, train_files: [a], test_file: b, test_fraction: 0.2}\n" GPT_TRAIN,
        NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.test_fraction");
    parse_err("name: g\nmodel: {type: gpt}\n"
              "data: {format: text, train_files: [a], classes: 3}\n" GPT_TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.classes");
    parse_err("name: g\nmodel: {type: resnet, vocab: 3}\n"
              "data: {format: synthetic}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "model.vocab");
#undef GPT_TRAIN
}
END_TEST

START_TEST(test_jobspec_normalize)
{
    static const char *const norm = "name: c\nmodel: {type: lenet}\n"
                                    "data:\n  format: cifar\n  train_files: [a.bin]\n"
                                    "  normalize: {mean: [0.4914, 0.4822, 0.4465],"
                                    " std: [0.247, 0.243, 0.261]}\n" TRAIN;
    struct mge_jobspec *s = parse_ok(norm, NULL, 0);
    struct mge_spec_error err;
    ck_assert_int_eq(s->data.n_norm, 3);
    ck_assert(s->data.norm_mean[1] == 0.4822);
    ck_assert(s->data.norm_std[2] == 0.261);
    char *text = mge_jobspec_to_json(s);
    json_t *j = json_loads(text, 0, NULL);
    json_t *n = json_object_get(json_object_get(j, "data"), "normalize");
    ck_assert_int_eq(json_array_size(json_object_get(n, "std")), 3);
    ck_assert(json_real_value(json_array_get(json_object_get(n, "mean"), 0)) == 0.4914);
    json_decref(j);
    mge_free(text);
    mge_jobspec_free(s);
    check_round_trip(norm, NULL, 0);
    s = parse_ok(MINIMAL, NULL, 0);
    ck_assert_int_eq(s->data.n_norm, 0);
    mge_jobspec_free(s);

    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  normalize: {mean: [0.5], std: [0]}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.normalize.std");
    ck_assert_ptr_nonnull(strstr(err.message, "item 1: expected a finite number > 0, got '0'"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  normalize: {mean: [0.5, 0.5], std: [1]}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.normalize.std");
    ck_assert_ptr_nonnull(strstr(err.message, "as many entries as data.normalize.mean (2)"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  normalize: {mean: [0.5], std: [1], scale: 2}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.normalize.scale");
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  normalize: {std: [1]}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.normalize.mean");
}
END_TEST

START_TEST(test_jobspec_augment)
{
    static const char *const aug = "name: c\nmodel: {type: resnet, depth: 8}\n"
                                   "data:\n  format: synthetic\n"
                                   "  augment: {crop_padding: 4, hflip: true}\n" TRAIN;
    struct mge_jobspec *s = parse_ok(aug, NULL, 0);
    struct mge_spec_error err;
    ck_assert_int_eq(s->data.aug_crop_padding, 4);
    ck_assert_int_eq(s->data.aug_hflip, 1);
    char *text = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(text, "\"augment\":{\"crop_padding\":4,\"hflip\":true}"));
    mge_free(text);
    mge_jobspec_free(s);
    check_round_trip(aug, NULL, 0);
    const char *ov[] = {"data.augment.hflip=false"};
    s = parse_ok(aug, ov, 1);
    ck_assert_int_eq(s->data.aug_hflip, 0);
    ck_assert_int_eq(s->data.aug_crop_padding, 4);
    mge_jobspec_free(s);
    s = parse_ok(MINIMAL, NULL, 0);
    ck_assert_int_eq(s->data.aug_crop_padding, 0);
    ck_assert_int_eq(s->data.aug_hflip, 0);
    text = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(text, "\"augment\":null"));
    mge_free(text);
    mge_jobspec_free(s);

    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  augment: {crop_padding: 65}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.augment.crop_padding");
    ck_assert_int_eq(err.line, 5);
    ck_assert_ptr_nonnull(strstr(err.message, "between 0 and 64"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  augment: {hflip: 2}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.augment.hflip");
    ck_assert_ptr_nonnull(strstr(err.message, "true or false"));
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  augment: {vflip: true}\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.augment.vflip");
    parse_err("name: c\nmodel: {type: lenet}\ndata:\n  format: synthetic\n"
              "  augment: true\n" TRAIN,
              NULL, 0, &err);
    ck_assert_str_eq(err.key, "data.augment");
}
END_TEST

START_TEST(test_jobspec_to_json_shape)
{
    struct mge_jobspec *s = parse_ok(FULL_IDX, NULL, 0);
    char *text = mge_jobspec_to_json(s);
    json_error_t jerr;
    json_t *j = json_loads(text, 0, &jerr), *v;
    ck_assert_ptr_nonnull(j);
    ck_assert_str_eq(json_string_value(json_object_get(j, "name")), "full-spec_1.0");
    ck_assert_int_eq(json_object_size(j), 8);
    v = json_object_get(j, "model");
    ck_assert_str_eq(json_string_value(json_object_get(v, "type")), "mlp");
    ck_assert_int_eq(json_array_size(json_object_get(v, "hidden")), 2);
    ck_assert(json_is_null(json_object_get(v, "layers")));
    v = json_object_get(j, "train");
    ck_assert(json_is_null(json_object_get(v, "steps")));
    ck_assert_int_eq(json_integer_value(json_object_get(v, "epochs")), 7);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(v, "optimizer"), "type")),
                     "adamw");
    ck_assert_double_eq(json_real_value(json_object_get(json_object_get(v, "optimizer"), "lr")),
                        0.001);
    ck_assert(json_is_false(json_object_get(v, "eval")));
    v = json_object_get(json_object_get(j, "resources"), "workers");
    ck_assert_int_eq(json_integer_value(json_object_get(v, "min")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(v, "max")), 4);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(j, "memory"), "sublinear")),
                     "light");
    ck_assert_str_eq(
        json_string_value(json_object_get(json_object_get(j, "distributed"), "backend")), "nccl");
    ck_assert_int_eq(json_integer_value(json_object_get(j, "priority")), -5);
    /* reals print short: 0.25, not 0.25000000000000000 or 0.050000000000000003 */
    ck_assert_ptr_nonnull(strstr(text, "\"dropout\":0.25"));
    ck_assert_ptr_nonnull(strstr(text, "\"lr\":0.001"));
    json_decref(j);
    mge_free(text);
    mge_jobspec_free(s);
    ck_assert_ptr_null(mge_jobspec_to_json(NULL));
}
END_TEST

/* resnet: depth and width default to ResNet-20 of width 16 and survive the JSON form. */
START_TEST(test_jobspec_resnet)
{
    struct mge_jobspec *s = parse_ok("name: r\nmodel: {type: resnet}\ndata: {format: synthetic}\n"
                                     "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n",
                                     NULL, 0);
    ck_assert_int_eq(s->model.depth, 20);
    ck_assert_int_eq(s->model.width, 16);
    ck_assert_str_eq(mge_model_type_name(s->model.type), "resnet");
    mge_jobspec_free(s);
    s = parse_ok("name: r\nmodel: {type: resnet, depth: 56, width: 8}\ndata: {format: synthetic}\n"
                 "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n",
                 NULL, 0);
    char *text = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(text, "\"depth\":56"));
    ck_assert_ptr_nonnull(strstr(text, "\"width\":8"));
    struct mge_jobspec *back = parse_ok(text, NULL, 0);
    ck_assert_int_eq(back->model.type, MGE_MODEL_RESNET);
    ck_assert_int_eq(back->model.depth, 56);
    ck_assert_int_eq(back->model.width, 8);
    mge_jobspec_free(back);
    mge_free(text);
    mge_jobspec_free(s);

    /* torchvision variants: width 64 by default, the ImageNet stem unless stem: cifar */
    s = parse_ok("name: r\nmodel: {type: resnet, variant: resnet50}\ndata: {format: synthetic}\n"
                 "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n",
                 NULL, 0);
    ck_assert_int_eq(s->model.variant, MGE_RESNET_50);
    ck_assert_int_eq(s->model.width, 64);
    ck_assert_int_eq(s->model.stem_cifar, 0);
    text = mge_jobspec_to_json(s);
    ck_assert_ptr_nonnull(strstr(text, "\"variant\":\"resnet50\""));
    ck_assert_ptr_nonnull(strstr(text, "\"stem\":\"imagenet\""));
    ck_assert_ptr_nonnull(strstr(text, "\"depth\":null"));
    mge_free(text);
    mge_jobspec_free(s);
    static const char *const tv = "name: r\nmodel: {type: resnet, variant: resnet18, stem: cifar, "
                                  "width: 8}\ndata: {format: synthetic}\n"
                                  "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n";
    s = parse_ok(tv, NULL, 0);
    ck_assert_int_eq(s->model.variant, MGE_RESNET_18);
    ck_assert_int_eq(s->model.stem_cifar, 1);
    ck_assert_int_eq(s->model.width, 8);
    ck_assert_str_eq(mge_resnet_variant_name(s->model.variant), "resnet18");
    mge_jobspec_free(s);
    check_round_trip(tv, NULL, 0);
    check_round_trip("name: r\nmodel: {type: resnet, depth: 8}\ndata: {format: synthetic}\n"
                     "train: {steps: 1, batch_size: 2, optimizer: {lr: 0.1}}\n",
                     NULL, 0);
}
END_TEST

START_TEST(test_jobspec_total_steps)
{
    struct mge_jobspec *s = parse_ok(MINIMAL, (const char *[]){"train.epochs=3"}, 1);
    ck_assert_int_eq(mge_jobspec_total_steps(s, 60000), 3 * 15000);
    ck_assert_int_eq(mge_jobspec_total_steps(s, 10), 3 * 3);    /* ceil(10 / 4) */
    ck_assert_int_eq(mge_jobspec_total_steps(s, 0), 3 * 15000); /* data.train_size */
    mge_jobspec_free(s);
    s = parse_ok(MINIMAL, (const char *[]){"train.steps=77"}, 1);
    ck_assert_int_eq(mge_jobspec_total_steps(s, 60000), 77);
    mge_jobspec_free(s);
    ck_assert_int_eq(mge_jobspec_total_steps(NULL, 5), 0);
}
END_TEST

START_TEST(test_jobspec_names)
{
    ck_assert_str_eq(mge_model_type_name(MGE_MODEL_DEEP_MLP), "deep_mlp");
    ck_assert_str_eq(mge_optim_type_name(MGE_OPTIM_ADAMW), "adamw");
    ck_assert_str_eq(mge_model_type_name((enum mge_model_type)99), "unknown");
}
END_TEST

/* Tests run from the repository root (make test) or from build/tests. */
static const char *example_path(char *buf, size_t cap, const char *name)
{
    static const char *const dirs[] = {"examples", "../examples", "../../examples"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(buf, cap, "%s/%s", dirs[i], name);
        if (access(buf, R_OK) == 0)
            return buf;
    }
    return NULL;
}

START_TEST(test_jobspec_load_examples)
{
    static const char *const names[] = {"fmnist-mlp.yaml", "fmnist-lenet.yaml", "deep-mlp.yaml",
                                        "fmnist-resnet20.yaml"};
    for (size_t i = 0; i < 4; i++) {
        char path[256];
        struct mge_jobspec *s = NULL;
        struct mge_spec_error err;
        ck_assert_ptr_nonnull(example_path(path, sizeof(path), names[i]));
        ck_assert_msg(mge_jobspec_load(path, NULL, 0, &s, &err) == MGE_OK, "%s", err.message);
        if (i == 0) {
            ck_assert_int_eq(s->model.n_hidden, 2);
            ck_assert_int_eq(s->model.hidden[0], 512);
            ck_assert_int_eq(s->train.epochs, 3);
            ck_assert_int_eq(s->train.batch_size, 128);
            ck_assert_double_eq(s->train.optim.lr, 0.05);
            ck_assert_double_eq(s->train.optim.momentum, 0.9);
            ck_assert_uint_eq(s->train.seed, 12);
        } else if (i == 1) {
            ck_assert_int_eq(s->model.type, MGE_MODEL_LENET);
            ck_assert_int_eq(s->train.epochs, 2);
        } else if (i == 3) {
            ck_assert_int_eq(s->model.type, MGE_MODEL_RESNET);
            ck_assert_int_eq(s->model.depth, 20);
            ck_assert_int_eq(s->model.width, 16);
            ck_assert(mge_model_takes_images(s->model.type));
        } else {
            ck_assert_int_eq(s->model.type, MGE_MODEL_DEEP_MLP);
            ck_assert_int_eq(s->model.layers, 128);
            ck_assert_int_eq(s->model.width, 1024);
            ck_assert_int_eq(s->data.input_dim, 1024);
            ck_assert_int_eq(s->train.steps, 20);
            ck_assert_int_eq(s->train.batch_size, 256);
        }
        mge_jobspec_free(s);
    }
}
END_TEST

START_TEST(test_jobspec_load_errors)
{
    struct mge_jobspec *s = NULL;
    struct mge_spec_error err;
    char path[] = "/tmp/test_jobspec_XXXXXX";
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, "name: [\n", 8), 8);
    close(fd);
    ck_assert_int_eq(mge_jobspec_load(path, NULL, 0, &s, &err), MGE_FORMAT);
    ck_assert_str_eq(err.file, path);
    ck_assert_int_eq(err.line, 2);
    unlink(path);
    ck_assert_int_eq(mge_jobspec_load(path, NULL, 0, &s, &err), MGE_NOENT);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(err.message, "cannot open"));
    ck_assert_int_eq(mge_jobspec_load("/", NULL, 0, &s, &err), MGE_IO);
    mge_jobspec_free(NULL);
}
END_TEST

/* "env:NAME": the spec a worker hands the ranks of a multi-node job in their environment */
START_TEST(test_jobspec_load_env)
{
    struct mge_jobspec *s = NULL;
    struct mge_spec_error err;
    const char *o[] = {"train.steps=7"};
    unsetenv("MGE_TEST_SPEC");
    ck_assert_int_eq(mge_jobspec_load("env:MGE_TEST_SPEC", NULL, 0, &s, &err), MGE_NOENT);
    ck_assert_ptr_null(s);
    ck_assert_ptr_nonnull(strstr(err.message, "MGE_TEST_SPEC is not set"));
    setenv("MGE_TEST_SPEC",
           "name: e\nmodel: {type: mlp, hidden: [4]}\n"
           "data: {format: synthetic, input_dim: 3, classes: 2, train_size: 10}\n"
           "train: {steps: 5, batch_size: 2, optimizer: {type: sgd, lr: 0.1}}\n", 1);
    ck_assert_msg(mge_jobspec_load("env:MGE_TEST_SPEC", o, 1, &s, &err) == MGE_OK, "%s",
                  err.message);
    ck_assert_str_eq(s->name, "e");
    ck_assert_int_eq(s->train.steps, 7);
    mge_jobspec_free(s);
    setenv("MGE_TEST_SPEC", "name: e\nbogus: 1\n", 1);
    ck_assert_int_ne(mge_jobspec_load("env:MGE_TEST_SPEC", NULL, 0, &s, &err), MGE_OK);
    ck_assert_str_eq(err.file, "env:MGE_TEST_SPEC");
    ck_assert_int_eq(err.line, 2);
    unsetenv("MGE_TEST_SPEC");
}
END_TEST

/* ---- allocation failures: every mge_* allocation in turn, until the parse succeeds ---- */

START_TEST(test_jobspec_alloc_failures)
{
    const char *ov[] = {"train.steps=5", "model.hidden=[3, 4]", "memory.budget_mb=1"};
    long n;
    for (n = 0; n < 100000; n++) {
        struct mge_jobspec *s = NULL;
        struct mge_spec_error err;
        int rc;
        mge_alloc_fail_after(n);
        rc = mge_jobspec_parse("job.yaml", FULL_IDX, strlen(FULL_IDX), ov, 3, &s, &err);
        mge_alloc_fail_after(-1);
        if (rc == MGE_OK) {
            ck_assert_ptr_nonnull(s);
            mge_jobspec_free(s);
            break;
        }
        ck_assert_msg(rc == MGE_NOMEM, "n=%ld: rc %d (%s)", n, rc, err.message);
        ck_assert_ptr_null(s);
        ck_assert_str_eq(err.message, "job.yaml: out of memory");
    }
    ck_assert_int_gt(n, 10); /* the loop did fail some allocations */
    ck_assert_int_lt(n, 100000);
}
END_TEST

START_TEST(test_jobspec_alloc_failures_json_and_load)
{
    struct mge_jobspec *s = parse_ok(FULL_SYNTH, NULL, 0);
    char path[256];
    long n;
    for (n = 0;; n++) {
        char *j;
        mge_alloc_fail_after(n);
        j = mge_jobspec_to_json(s);
        mge_alloc_fail_after(-1);
        if (j) {
            mge_free(j);
            break;
        }
    }
    ck_assert_int_ge(n, 1);
    mge_jobspec_free(s);
    ck_assert_ptr_nonnull(example_path(path, sizeof(path), "fmnist-mlp.yaml"));
    for (n = 0;; n++) {
        struct mge_spec_error err;
        int rc;
        s = NULL;
        mge_alloc_fail_after(n);
        rc = mge_jobspec_load(path, NULL, 0, &s, &err);
        mge_alloc_fail_after(-1);
        if (rc == MGE_OK)
            break;
        ck_assert_int_eq(rc, MGE_NOMEM);
        ck_assert_ptr_null(s);
    }
    mge_jobspec_free(s);
}
END_TEST

static Suite *jobspec_suite(void)
{
    Suite *s = suite_create("jobspec");
    TCase *tc;

    tc = tcase_create("parse");
    tcase_add_test(tc, test_jobspec_parse_full_idx);
    tcase_add_test(tc, test_jobspec_parse_full_synthetic);
    tcase_add_test(tc, test_jobspec_parse_json_body);
    suite_add_tcase(s, tc);

    tc = tcase_create("defaults");
    tcase_add_test(tc, test_jobspec_defaults);
    tcase_add_test(tc, test_jobspec_clip_smoothing_decay);
    tcase_add_test(tc, test_jobspec_eager);
    tcase_add_test(tc, test_jobspec_precision);
    tcase_add_test(tc, test_jobspec_defaults_dependent);
    tcase_add_test(tc, test_jobspec_device_sim);
    tcase_add_test(tc, test_jobspec_classes_limit_is_the_engines);
    suite_add_tcase(s, tc);

    tc = tcase_create("errors");
    tcase_add_loop_test(tc, test_jobspec_errors, 0,
                        (int)(sizeof(err_cases) / sizeof(err_cases[0])));
    tcase_add_test(tc, test_jobspec_error_column_and_null_err);
    tcase_add_test(tc, test_jobspec_error_too_big);
    tcase_add_test(tc, test_jobspec_error_deep_nesting);
    suite_add_tcase(s, tc);

    tc = tcase_create("overrides");
    tcase_add_test(tc, test_jobspec_override_number);
    tcase_add_test(tc, test_jobspec_override_list_and_string);
    tcase_add_test(tc, test_jobspec_override_creates_keys);
    tcase_add_test(tc, test_jobspec_override_steps_clears_epochs);
    tcase_add_test(tc, test_jobspec_override_errors);
    tcase_add_test(tc, test_jobspec_override_not_a_mapping);
    suite_add_tcase(s, tc);

    tc = tcase_create("forms");
    tcase_add_test(tc, test_jobspec_round_trip);
    tcase_add_test(tc, test_jobspec_npy);
    tcase_add_test(tc, test_jobspec_cifar);
    tcase_add_test(tc, test_jobspec_gpt);
    tcase_add_test(tc, test_jobspec_normalize);
    tcase_add_test(tc, test_jobspec_augment);
    tcase_add_test(tc, test_jobspec_to_json_shape);
    tcase_add_test(tc, test_jobspec_resnet);
    tcase_add_test(tc, test_jobspec_total_steps);
    tcase_add_test(tc, test_jobspec_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("load");
    tcase_add_test(tc, test_jobspec_load_examples);
    tcase_add_test(tc, test_jobspec_load_errors);
    tcase_add_test(tc, test_jobspec_load_env);
    suite_add_tcase(s, tc);

    tc = tcase_create("alloc");
    tcase_add_test(tc, test_jobspec_alloc_failures);
    tcase_add_test(tc, test_jobspec_alloc_failures_json_and_load);
    tcase_set_timeout(tc, 60);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return mge_test_run(jobspec_suite()); }
