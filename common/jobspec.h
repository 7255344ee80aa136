/*
 * jobspec.h: the job spec (YAML, read with libyaml), its validation and --set overrides.
 * One validator serves mge-train, mge-coordinator and mgectl, so a spec is judged the same
 * everywhere. docs/job-spec.md is the user-facing reference of every key.
 */
#ifndef MGE_COMMON_JOBSPEC_H
#define MGE_COMMON_JOBSPEC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MGE_SPEC_MAX_LAYERS 64
#define MGE_SPEC_NAME_MAX 128
/* data.train_files: at most this many CIFAR files (MGE_CIFAR_MAX_FILES in engine/data.h) */
#define MGE_SPEC_MAX_DATA_FILES 16
/* data.normalize: at most this many channels */
#define MGE_SPEC_MAX_CHANNELS 16
/* data.augment.crop_padding: at most this many pixels (MGE_AUGMENT_MAX_PADDING in engine/data.h) */
#define MGE_SPEC_MAX_CROP_PADDING 64
/* The most classes a model may have: the spec (data.classes) and the engine (synthetic data,
 * the output layer) share this one limit. */
#define MGE_CLASSES_MAX 65536
/* The most cores one rank may use: resources.cpus, mge-train --threads, mge-worker --cpus. */
#define MGE_CPUS_MAX 4096

enum mge_model_type {
    MGE_MODEL_MLP,
    MGE_MODEL_LENET,
    MGE_MODEL_DEEP_MLP,
    MGE_MODEL_RESNET,
    MGE_MODEL_GRAPH, /* nodes declared in the spec (common/graphspec.h) */
    MGE_MODEL_GPT,   /* decoder-only transformer (engine/model.c) */
};
struct mge_graphspec;
/* model.variant of resnet: CIFAR-style 6n+2, or torchvision's ImageNet family */
enum mge_resnet_variant {
    MGE_RESNET_CIFAR,
    MGE_RESNET_18,
    MGE_RESNET_34,
    MGE_RESNET_50,
    MGE_RESNET_101,
    MGE_RESNET_152
};
enum mge_activation { MGE_ACT_RELU, MGE_ACT_GELU, MGE_ACT_TANH, MGE_ACT_SIGMOID };
enum mge_data_format {
    MGE_DATA_IDX,
    MGE_DATA_SYNTHETIC,
    MGE_DATA_NPY,
    MGE_DATA_CIFAR,
    MGE_DATA_TOKENS, /* flat uint16/uint32 token ids (gpt) */
    MGE_DATA_TEXT,   /* bytes of text files as tokens, vocab 256 (gpt) */
};
enum mge_optim_type { MGE_OPTIM_SGD, MGE_OPTIM_ADAM, MGE_OPTIM_ADAMW };
enum mge_sched_type { MGE_SCHED_CONSTANT, MGE_SCHED_STEP, MGE_SCHED_COSINE };
/* sim: the engine's simulated accelerator (tests of the device seam); placed as cpu jobs are */
enum mge_device_kind { MGE_DEVICE_CPU, MGE_DEVICE_GPU, MGE_DEVICE_SIM };
/* train.precision: what GEMMs and convolutions compute in (parameters stay fp32) */
enum mge_precision { MGE_PRECISION_FP32, MGE_PRECISION_BF16 };
enum mge_sublinear_mode { MGE_SUBLINEAR_OFF, MGE_SUBLINEAR_ON, MGE_SUBLINEAR_AUTO, MGE_SUBLINEAR_LIGHT };
/* quant.mode and quant.observer (docs/job-spec.md "quant") */
enum mge_quant_spec_mode { MGE_QUANT_SPEC_NONE, MGE_QUANT_SPEC_QAT };
enum mge_quant_spec_observer {
    MGE_QUANT_SPEC_MINMAX,
    MGE_QUANT_SPEC_EMA,
    MGE_QUANT_SPEC_PERCENTILE
};
enum mge_backend { MGE_BACKEND_AUTO, MGE_BACKEND_LOCAL, MGE_BACKEND_MPI, MGE_BACKEND_NCCL };

struct mge_model_spec {
    enum mge_model_type type;        /* model.type: mlp | lenet | deep_mlp | resnet | graph */
    int hidden[MGE_SPEC_MAX_LAYERS]; /* model.hidden: list of hidden sizes (mlp) */
    int n_hidden;                  /* entries used in hidden[] */
    enum mge_activation activation; /* model.activation (default relu) */
    int layers;                    /* model.layers: deep_mlp depth (default 128) */
    int width;                     /* model.width: deep_mlp width (default 1024); resnet's
                                      first stage's channels (default 16) */
    int depth;                     /* model.depth: resnet depth, 6n+2 (default 20) */
    enum mge_resnet_variant variant; /* model.variant: resnet (default cifar) */
    int stem_cifar; /* model.stem: cifar (1): 3x3/1 conv, no max pool; imagenet (0, the
                       default of the torchvision variants): 7x7/2 conv + 3x3/2 max pool */
    float dropout;                 /* model.dropout: 0 = off (default 0) */
    struct mge_graphspec *graph;   /* model.nodes (graph only, else NULL); owned by the spec */
    /* gpt (layers above is its block count, default 4): */
    int heads;   /* model.heads (default 4); d_model % heads == 0 */
    int d_model; /* model.d_model: embedding width (default 128) */
    int context; /* model.context: tokens per window (default 128; graph: its tokens node's) */
    int vocab;   /* model.vocab: token ids are below it (default 256; graph: its tokens node's) */
};

struct mge_data_spec {
    enum mge_data_format format;   /* data.format: idx | synthetic | npy | cifar */
    char *train_images;            /* data.train_images (idx: gz or plain; npy: inputs .npy) */
    char *train_labels;
    char *test_images;             /* optional: no test set when NULL */
    char *test_labels;
    /* synthetic only: */
    int64_t train_size;            /* data.train_size (default 60000) */
    int64_t test_size;             /* data.test_size (default 10000) */
    int input_dim;                 /* data.input_dim: features per sample (default 784) */
    int classes;                   /* data.classes, [2, MGE_CLASSES_MAX] (default 10) */
    int image_h, image_w, channels; /* data.image: [c, h, w] for conv models (default 1,28,28) */
    int prefetch;                  /* data.prefetch: batches read ahead (default 2) */
    int image_given, input_dim_given; /* npy: the file must agree with data.image/input_dim */
    char *train_files[MGE_SPEC_MAX_DATA_FILES]; /* cifar: data.train_files */
    int n_train_files;
    char *test_file;      /* cifar, tokens, text: data.test_file; optional */
    int token_bytes;      /* tokens: data.dtype uint16 (2, default) | uint32 (4); text: 1 */
    double test_fraction; /* tokens, text without test_file: held-out tail (default 0.1) */
    int n_norm;                    /* data.normalize: channels given; 0: no normalisation */
    double norm_mean[MGE_SPEC_MAX_CHANNELS], norm_std[MGE_SPEC_MAX_CHANNELS]; /* std > 0 */
    int aug_crop_padding; /* data.augment.crop_padding: [0, 64] pixels (default 0) */
    int aug_hflip;        /* data.augment.hflip: bool (default false) */
};

struct mge_optim_spec {
    enum mge_optim_type type;      /* train.optimizer.type: sgd | adam | adamw */
    double lr;                     /* > 0 */
    double momentum;               /* sgd, [0,1) */
    int nesterov;                  /* sgd, bool */
    double weight_decay;           /* >= 0 */
    double beta1, beta2, eps;      /* adam/adamw (defaults 0.9, 0.999, 1e-8) */
    int no_decay_1d;               /* decay_1d: false (default true) sets it: 1-D parameters
                                    * (biases, norm weights) get no weight decay */
};

struct mge_sched_spec {
    enum mge_sched_type type;      /* train.lr_schedule.type: constant | step | cosine */
    int64_t step_size;             /* step: every step_size steps ... */
    double gamma;                  /* ... multiply by gamma */
    int64_t warmup_steps;          /* cosine: linear warmup steps */
    double min_lr;                 /* cosine: floor */
};

struct mge_train_spec {
    int epochs;                    /* train.epochs; 0 when steps is given */
    int64_t steps;                 /* train.steps; 0 when epochs is given */
    int batch_size;                /* train.batch_size: global batch */
    struct mge_optim_spec optim;   /* train.optimizer */
    struct mge_sched_spec sched;   /* train.lr_schedule (default constant) */
    uint64_t seed;                 /* train.seed (default 42) */
    int64_t checkpoint_every;      /* train.checkpoint_every: steps; 0 = only at the end */
    int64_t checkpoint_every_sec;  /* train.checkpoint_every_sec: seconds; 0 = off */
    int64_t log_every;             /* train.log_every: steps between metric lines (default 1) */
    int eval_every_epoch;          /* train.eval: evaluate each epoch (default 1) */
    int eager;                     /* train.eager: op by op, every value checked (default 0) */
    double clip_grad_norm;         /* train.clip_grad_norm: > 0; 0 = absent, no clipping */
    double label_smoothing;        /* train.label_smoothing: [0, 1) (default 0) */
    enum mge_precision precision;  /* train.precision: fp32 | bf16 (default fp32) */
};

struct mge_resources_spec {
    enum mge_device_kind device;   /* resources.device: cpu | gpu | sim */
    int workers_min, workers_max;  /* resources.workers: N or {min, max} (default 1) */
    int cpus;                      /* resources.cpus: cores per worker (default 1) */
    int gpus;                      /* resources.gpus: per worker (default 0; 1 if device gpu) */
    int64_t memory_mb;             /* resources.memory_mb: per worker (default 0 = any) */
};

struct mge_memory_spec {
    enum mge_sublinear_mode sublinear; /* memory.sublinear: false | true | auto | light */
    int64_t budget_mb;             /* memory.budget_mb: 0 = none */
};

struct mge_quant_spec {
    enum mge_quant_spec_mode mode;         /* quant.mode: none | qat (default none) */
    enum mge_quant_spec_observer observer; /* quant.observer: minmax | ema | percentile */
    int64_t start_step; /* quant.start_step: fake quantisation from this step on */
    double momentum;    /* quant.momentum: ema/percentile average weight (0.01) */
    double percentile;  /* quant.percentile: in (50, 100] (default 99.99) */
};

struct mge_dist_spec {
    enum mge_backend backend;      /* distributed.backend: auto | local | mpi | nccl */
    double pack_mb;                /* distributed.pack_mb (default 10) */
    int deterministic;             /* distributed.deterministic: bool (default false) */
    int micro_shards;              /* distributed.micro_shards: S fixed slices of each global
                                    * batch (used when deterministic; default 12, rounded up to a
                                    * multiple of 12 >= workers.max, at most train.batch_size) */
};

struct mge_jobspec {
    char *name;                    /* name: [A-Za-z0-9._-]{1,128} */
    struct mge_model_spec model;
    struct mge_data_spec data;
    struct mge_train_spec train;
    struct mge_resources_spec resources;
    struct mge_memory_spec memory;
    struct mge_dist_spec distributed;
    struct mge_quant_spec quant;
    int priority;                  /* priority: -100..100 (default 0) */
    char *source;                  /* the YAML text after overrides, canonical (for checkpoints) */
};

/*
 * Where a spec error is. All strings are owned by the struct (static buffers).
 * Example message: "job.yaml:12: train.optimizer.lr: expected a number > 0, got 'fast'".
 */
struct mge_spec_error {
    char file[256];                /* file name, or "<request>" for bodies */
    int line;                      /* 1-based; 0 when not known */
    int column;                    /* 1-based; 0 when not known */
    char key[128];                 /* dotted key path ("train.optimizer.lr"); "" if none */
    char message[512];             /* full human message, as above */
};

/*
 * Parse and validate a YAML spec held in memory.
 * @name: file name for messages ("<request>" for HTTP bodies). @text/@len: the YAML.
 * @overrides: "key.path=value" strings applied before validation (NULL if @n_overrides is 0);
 *   the value is parsed as a YAML scalar or flow sequence ("[512, 512]"). The path must name
 *   a known key; a missing key (and its section) is added. Setting train.steps removes
 *   train.epochs and vice versa. Later overrides win. docs/job-spec.md has the rules.
 * On MGE_OK *@out is a new spec the caller frees with mge_jobspec_free().
 * On MGE_SPEC (bad spec) or MGE_FORMAT (bad YAML) @err (if not NULL) says where and why,
 * and *@out is NULL; likewise MGE_NOMEM. Unknown keys are errors that name the key and its line.
 * Thread: any (no shared state).
 * Never crashes on any input (fuzzed).
 */
int mge_jobspec_parse(const char *name, const char *text, size_t len, const char *const *overrides,
                      int n_overrides, struct mge_jobspec **out, struct mge_spec_error *err);

/*
 * As mge_jobspec_parse(), reading @path (MGE_NOENT/MGE_IO with @err filled if unreadable).
 * "env:NAME" reads the YAML from environment variable NAME instead (how a worker hands the
 * spec to the ranks of a multi-node job, where no file path is valid on every node).
 */
int mge_jobspec_load(const char *path, const char *const *overrides, int n_overrides,
                     struct mge_jobspec **out, struct mge_spec_error *err);

/* Free a spec from parse/load; NULL does nothing. */
void mge_jobspec_free(struct mge_jobspec *spec);

/*
 * Total training steps for @train_size samples (epochs * ceil(train_size / batch) or steps).
 * @train_size <= 0 uses spec->data.train_size. Saturates at INT64_MAX.
 */
int64_t mge_jobspec_total_steps(const struct mge_jobspec *spec, int64_t train_size);

/*
 * The spec as one JSON object string (all keys, defaults filled in), for the REST API.
 * Returns a new string the caller frees with mge_free(), or NULL on OOM.
 */
char *mge_jobspec_to_json(const struct mge_jobspec *spec);

/* Stable names of enum values as they appear in YAML ("sgd", "cosine", ...). */
const char *mge_model_type_name(enum mge_model_type t);
/*
 * Whether the model reads token windows (type gpt, or a graph whose input is op tokens): it
 * trains on data.format tokens or text, with model.context and model.vocab set (for a graph,
 * from its tokens node).
 */
bool mge_model_reads_tokens(const struct mge_model_spec *m);
/* Whether model type @t takes images (N, C, H, W) rather than flat features. */
bool mge_model_takes_images(enum mge_model_type t);
const char *mge_optim_type_name(enum mge_optim_type t);
/* "cifar", "resnet18", ... "resnet152"; "unknown" out of range. */
const char *mge_resnet_variant_name(enum mge_resnet_variant v);

#ifdef __cplusplus
}
#endif
#endif
