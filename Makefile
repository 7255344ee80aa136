# mge: one non-recursive Makefile. Everything is built under build/ (binaries in build/bin/).
#   make            build everything          make test     deps + build + all tests
#   make demo       deps + build + main job   make bench    benchmarks (side by side with PyTorch/MPI)
#   make fuzz       long fuzz runs            make SANITIZE=address,undefined test
#   make V=1        show commands             CI=true / DEVELOPER=1: warnings are errors
#   make web        the dashboard into build/web (npm ci from coordinator/web/package-lock.json)

BUILD   ?= build
CC      ?= cc
CLANG   ?= clang
NVCC    ?= $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME ?= /usr/local/cuda
PROTOC_C ?= protoc-c

WARN  := -Wall -Wextra -Wpedantic -Wshadow -Wstrict-prototypes -Wmissing-prototypes \
         -Wpointer-arith -Wwrite-strings -Wvla -Wformat=2 -fno-common
# Portable by default: binaries run on every x86-64 node of a cluster; the vectorised kernels
# pick AVX-512 / AVX2 / baseline code at run time (kernels/cpu/cpu_int.h). `make MARCH=native`
# builds for this CPU only (one kernel version, MGE_NO_CLONES).
MARCH ?=
OPT   ?= -O2 $(if $(MARCH),-march=$(MARCH) -DMGE_NO_CLONES,)
DEBUG ?= -g
ALL_CFLAGS = -std=c11 -D_GNU_SOURCE $(WARN) $(OPT) $(DEBUG) -fopenmp -MMD -MP \
             -I. -I$(BUILD)/gen $(CFLAGS)
ALL_LDFLAGS = -fopenmp $(LDFLAGS)
LIBS_BLAS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -ldnnl
LIBS_PROTO  := -lprotobuf-c
LIBS_COMMON := -lyaml -ljansson -lz -lm -lpthread -lcrypto
LIBS_DAEMON := -lmicrohttpd -lgnutls -lsqlite3 -lnng -luv -lcurl

# Open MPI (the mpi backend) and NCCL (the nccl backend) are optional: without them the
# backend is a stub that says so. System headers go in with -isystem (not our warnings).
MPI_CFLAGS  := $(patsubst -I%,-isystem %,$(shell pkg-config --cflags ompi-c 2>/dev/null))
MPI_LIBS    := $(shell pkg-config --libs ompi-c 2>/dev/null)
HAVE_MPI    := $(if $(MPI_LIBS),1,)
HAVE_NCCL   := $(if $(NVCC),$(if $(wildcard $(CUDA_HOME)/include/nccl.h),1,),)
ifneq ($(HAVE_NCCL),)
NCCL_LIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcudart
endif
# The cuda device (engine/device_cuda.c, kernels/cuda/*.cu: cuBLAS and cuDNN) is built with nvcc
# and cuDNN; without them device_cuda_none.c says "no CUDA" and nothing links a CUDA library.
HAVE_CUDA   := $(if $(NVCC),$(if $(wildcard $(CUDA_HOME)/include/cudnn.h),1,),)
ifneq ($(HAVE_CUDA),)
# (cuBLAS is loaded at run time, kernels/cuda/cuda_ops.cu: linking it costs every process 0.2 s)
CUDA_LIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcudnn -lcudart -ldl -lstdc++
endif
# every program that links the engine links its devices' and collectives' libraries
LIBS_COMM   := $(MPI_LIBS) $(NCCL_LIBS) $(CUDA_LIBS)

ifneq ($(filter true 1,$(CI)),)
DEVELOPER = 1
endif
ifdef DEVELOPER
ALL_CFLAGS += -Werror
endif
ifdef SANITIZE
ALL_CFLAGS  += -fsanitize=$(SANITIZE) -fno-sanitize-recover=all -fno-omit-frame-pointer
ALL_LDFLAGS += -fsanitize=$(SANITIZE)
endif

ifeq ($(V),1)
Q =
else
Q = @
endif

.PHONY: all deps demo test test-unit test-integration test-fuzz bench bench-tools fuzz format clean cuda web \
        test-gpu bench-gpu
all: binaries web

# keep generated headers and test objects (make would delete them as intermediates)
.SECONDARY:

# ---- dependencies: apt-get what is missing (idempotent, quiet when nothing is) ----
deps:
	$(Q)sh deploy/install-deps.sh

# ---- generated protobuf code ----
PROTOS    := $(wildcard proto/*.proto)
PROTO_C   := $(patsubst proto/%.proto,$(BUILD)/gen/proto/%.pb-c.c,$(PROTOS))
PROTO_H   := $(PROTO_C:.c=.h)
$(BUILD)/gen/proto/%.pb-c.c $(BUILD)/gen/proto/%.pb-c.h: proto/%.proto
	@mkdir -p $(BUILD)/gen
	@echo "  PROTOC  $<"
	$(Q)$(PROTOC_C) --c_out=$(BUILD)/gen $<

# ---- sources by module (a new .c file in a module is picked up automatically) ----
COMMON_SRC  := $(wildcard common/*.c)
KERNEL_SRC  := $(sort $(wildcard kernels/*.c kernels/cpu/*.c))
ENGINE_MAIN := engine/main_train.c engine/main_infer.c engine/main_export.c engine/main_quantize.c
# engine/comm and the cuda device: each piece that needs a library has a stub twin; exactly one
# of each is built
COMM_ALT    := engine/comm/comm_mpi.c engine/comm/comm_mpi_none.c \
               engine/comm/comm_nccl.c engine/comm/comm_nccl_none.c \
               engine/device_cuda.c engine/device_cuda_none.c
ENGINE_SRC  := $(filter-out $(ENGINE_MAIN) $(COMM_ALT),$(wildcard engine/*.c engine/*/*.c)) \
               $(if $(HAVE_MPI),engine/comm/comm_mpi.c,engine/comm/comm_mpi_none.c) \
               $(if $(HAVE_NCCL),engine/comm/comm_nccl.c,engine/comm/comm_nccl_none.c) \
               $(if $(HAVE_CUDA),engine/device_cuda.c,engine/device_cuda_none.c)
COORD_SRC   := $(wildcard coordinator/*.c)
WORKER_SRC  := $(wildcard worker/*.c)
CLI_SRC     := $(wildcard cli/*.c)

obj = $(patsubst %.c,$(BUILD)/obj/%.o,$(1))

LIB_COMMON := $(BUILD)/lib/libmgecommon.a
LIB_PROTO  := $(BUILD)/lib/libmgeproto.a
LIB_KERN   := $(BUILD)/lib/libmgekernels.a
LIB_ENGINE := $(BUILD)/lib/libmge.a

$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) $(ALL_CFLAGS) -c $< -o $@

# the direct conv's and the attention's vector loops are written as a * b + c: let them become
# FMAs (-std=c11 turns contraction off); results stay deterministic, only the rounding differs
$(BUILD)/obj/kernels/cpu/conv_direct.o $(BUILD)/obj/kernels/cpu/attention.o \
    $(BUILD)/obj/kernels/cpu/conv_winograd.o $(BUILD)/obj/kernels/cpu/conv_stride2.o: \
    ALL_CFLAGS += -ffp-contract=fast
# its 64-byte vectors pass between static, always-inlined helpers only: no ABI boundary, so
# GCC's note that the baseline clone passes them differently from the AVX-512 one is moot
$(BUILD)/obj/kernels/cpu/conv_direct.o $(BUILD)/obj/kernels/cpu/conv_winograd.o \
    $(BUILD)/obj/kernels/cpu/conv_stride2.o: ALL_CFLAGS += -Wno-psabi
# kernels: full auto-vectorisation (GCC 12's -O2 only vectorises with its very-cheap model)
$(BUILD)/obj/kernels/cpu/%.o: OPT += -O3
# the Winograd weight gradients' shared part and F(4x4)'s transforms: as conv_winograd.o
$(BUILD)/obj/kernels/cpu/conv_winograd_dw.o $(BUILD)/obj/kernels/cpu/conv_winograd4_dw.o: \
    ALL_CFLAGS += -ffp-contract=fast -Wno-psabi

$(BUILD)/obj/engine/comm/comm_mpi.o: ALL_CFLAGS += $(MPI_CFLAGS)
$(BUILD)/obj/engine/comm/comm_nccl.o $(BUILD)/obj/tests/unit/test_comm_nccl.o \
    $(BUILD)/obj/tests/unit/test_cuda.o: ALL_CFLAGS += -isystem $(CUDA_HOME)/include

# generated code is not ours: build it without our warning set
$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c $(PROTO_H)
	@mkdir -p $(dir $@)
	@echo "  CC      $<"
	$(Q)$(CC) -std=c11 $(OPT) $(DEBUG) -I$(BUILD)/gen $(filter -fsanitize=%,$(ALL_CFLAGS)) -c $< -o $@

$(LIB_COMMON): $(call obj,$(COMMON_SRC))
$(LIB_PROTO): $(patsubst $(BUILD)/gen/%.c,$(BUILD)/obj/gen/%.o,$(PROTO_C))
$(LIB_KERN): $(call obj,$(KERNEL_SRC))
$(LIB_ENGINE): $(call obj,$(ENGINE_SRC))
$(BUILD)/lib/%.a:
	@mkdir -p $(dir $@)
	@echo "  AR      $@"
	$(Q)rm -f $@ && ar rcs $@ $^

LIB_CUDA := $(BUILD)/lib/libmgecuda.a
ENGINE_LIBS = $(LIB_ENGINE) $(if $(HAVE_CUDA),$(LIB_CUDA)) $(LIB_KERN) $(LIB_PROTO) $(LIB_COMMON)
BIN := $(BUILD)/bin

$(BIN)/mge-train: $(call obj,engine/main_train.c) $(ENGINE_LIBS)
$(BIN)/mge-infer: $(call obj,engine/main_infer.c) $(ENGINE_LIBS)
$(BIN)/mge-export: $(call obj,engine/main_export.c) $(ENGINE_LIBS)
$(BIN)/mge-quantize: $(call obj,engine/main_quantize.c) $(ENGINE_LIBS)
$(BIN)/mge-train $(BIN)/mge-infer $(BIN)/mge-export $(BIN)/mge-quantize:
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_BLAS) $(LIBS_PROTO) $(LIBS_COMM) $(LIBS_COMMON)

BINARIES := $(BIN)/mge-train $(BIN)/mge-infer $(BIN)/mge-export $(BIN)/mge-quantize

ifneq ($(COORD_SRC),)
$(BIN)/mge-coordinator: $(call obj,$(COORD_SRC) engine/ckpt.c) $(LIB_PROTO) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_DAEMON) $(LIBS_PROTO) $(LIBS_COMMON)
BINARIES += $(BIN)/mge-coordinator
endif
ifneq ($(WORKER_SRC),)
$(BIN)/mge-worker: $(call obj,$(WORKER_SRC) engine/ckpt.c) $(LIB_PROTO) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_DAEMON) $(LIBS_PROTO) $(LIBS_COMMON)
BINARIES += $(BIN)/mge-worker
endif
$(BIN)/mge-launch: $(call obj,$(wildcard worker/agent/*.c)) $(LIB_PROTO) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ -lnng $(LIBS_PROTO) $(LIBS_COMMON)
BINARIES += $(BIN)/mge-launch
ifneq ($(CLI_SRC),)
$(BIN)/mgectl: $(call obj,$(CLI_SRC)) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ -lcurl $(LIBS_COMMON)
BINARIES += $(BIN)/mgectl
endif

# ---- CUDA: compiled and linked when nvcc and cuDNN exist; nothing needs a GPU to build or test ----
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
# GPU architectures the kernels are built for: machine code for each (T4, A100, A10/3090, L4/4090,
# H100, B200, RTX 50) plus PTX of the newest, which the driver compiles for GPUs newer still.
# `make CUDA_ARCHS=90` builds for one.
CUDA_ARCHS ?= 75 80 86 89 90 100 120
NVCC_ARCH := $(foreach a,$(CUDA_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(CUDA_ARCHS)),code=compute_$(lastword $(CUDA_ARCHS))
NVCC_WARN := -Xcompiler -Wall,-Wextra $(if $(DEVELOPER),-Werror all-warnings -Xcompiler -Werror)
ifneq ($(HAVE_CUDA),)
ifneq ($(CUDA_SRC),)
CUDA_OBJ := $(patsubst %.cu,$(BUILD)/obj/%.o,$(CUDA_SRC))
$(BUILD)/obj/%.o: %.cu
	@mkdir -p $(dir $@)
	@echo "  NVCC    $<"
	$(Q)$(NVCC) -O2 -std=c++17 -I. $(NVCC_ARCH) $(NVCC_WARN) -MMD -MP -c $< -o $@
$(LIB_CUDA): $(CUDA_OBJ)
BINARIES += $(LIB_CUDA)
endif
endif
cuda:
	@if [ -z "$(HAVE_CUDA)" ]; then echo "nvcc or cuDNN not found: CPU-only build"; fi

binaries: $(BINARIES)

# ---- the web dashboard: coordinator/web/ -> $(BUILD)/web/ (npm ci from the lock file, esbuild);
# without node/npm it prints a note and the rest of the build is unaffected ----
WEB_SRC := $(wildcard coordinator/web/src/*) coordinator/web/build.mjs coordinator/web/build.sh \
           coordinator/web/package-lock.json
web: $(BUILD)/web/index.html
$(BUILD)/web/index.html: $(WEB_SRC)
	$(Q)sh coordinator/web/build.sh $(BUILD)/web

# ---- tests: one Check binary per tests/unit/test_<module>.c ----
UNIT_SRC := $(wildcard tests/unit/test_*.c)
ifeq ($(CUDA_OBJ),)
UNIT_SRC := $(filter-out tests/unit/test_cuda.c,$(UNIT_SRC))
endif
ifeq ($(HAVE_NCCL),)
UNIT_SRC := $(filter-out tests/unit/test_comm_nccl.c,$(UNIT_SRC))
endif
UNIT_BIN := $(patsubst tests/unit/%.c,$(BUILD)/tests/%,$(UNIT_SRC))
TEST_SUPPORT := $(wildcard tests/unit/support/*.c)
TEST_LIBS = $(LIBS_BLAS) $(LIBS_PROTO) $(LIBS_COMM) $(LIBS_COMMON) $(shell pkg-config --libs check) \
            -lsqlite3 -lnng -lcurl
# tests of the coordinator's modules (store, scheduler) link them from one library, without main.c
LIB_COORD := $(BUILD)/lib/libmgecoord.a
$(LIB_COORD): $(call obj,$(filter-out coordinator/main.c,$(COORD_SRC)))
COORD_TESTS := $(BUILD)/tests/test_sched $(BUILD)/tests/test_store $(BUILD)/tests/test_ckpt_path \
               $(BUILD)/tests/test_ckpt_store
$(COORD_TESTS): $(BUILD)/tests/test_%: $(call obj,tests/unit/test_%.c) $(call obj,$(TEST_SUPPORT)) \
    $(LIB_COORD) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(TEST_LIBS) $(LIBS_DAEMON)
# the worker's /proc probe, linked into its test alone (the worker has no library)
$(BUILD)/tests/test_procstat: $(call obj,worker/procstat.c)
# ... and its GPU detection (the MGE_FAKE_GPUS hook, CUDA_VISIBLE_DEVICES of a rank), which
# allocates through common/: linked before the libraries
$(BUILD)/tests/test_gpus: $(call obj,tests/unit/test_gpus.c worker/gpus.c) $(call obj,$(TEST_SUPPORT)) \
    $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(TEST_LIBS)
$(BUILD)/tests/test_%: $(call obj,tests/unit/test_%.c) $(call obj,$(TEST_SUPPORT)) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(TEST_LIBS)

test: deps
	$(Q)$(MAKE) --no-print-directory binaries web tests-build
	$(Q)sh tests/run-tests.sh $(BUILD)

# attack tools for the integration tests (tests/tools/mge-<name>.c -> $(BUILD)/tests/mge-<name>)
TOOL_BIN := $(patsubst tests/tools/%.c,$(BUILD)/tests/%,$(wildcard tests/tools/mge-*.c))
$(BUILD)/tests/mge-%: $(call obj,tests/tools/mge-%.c) $(LIB_PROTO) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ -lnng $(LIBS_PROTO) $(LIBS_COMMON)

# mge-convert writes .npy files with the unit tests' writer (common/npy.c: it comes after the
# libraries on the link line)
$(BUILD)/tests/mge-convert: $(call obj,tests/unit/support/npy_write.c common/npy.c)

tests-build: $(UNIT_BIN) $(TOOL_BIN)

# ---- fuzzing (clang libFuzzer) ----
FUZZ_SRC := $(wildcard tests/fuzz/fuzz_*.c)
fuzz: deps
	$(Q)FUZZ_SECONDS=$${FUZZ_SECONDS:-300} sh tests/fuzz/run.sh $(BUILD) long

# ---- benchmarks ----
BENCH_TOOLS :=
ifneq ($(HAVE_MPI),)
# gradient all-reduce three ways (raw MPI, per tensor, mge packs): tests/bench/comm.sh
$(BUILD)/obj/tests/bench/mge-commbench.o: ALL_CFLAGS += $(MPI_CFLAGS)
$(BUILD)/bench/mge-commbench: $(call obj,tests/bench/mge-commbench.c) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_BLAS) $(LIBS_PROTO) $(LIBS_COMM) $(LIBS_COMMON)
BENCH_TOOLS += $(BUILD)/bench/mge-commbench
endif
# the memory planner on random interval sets (also built and run by tests/bench/sublinear.py)
$(BUILD)/bench/bench_planner: $(call obj,tests/bench/bench_planner.c) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_BLAS) $(LIBS_PROTO) $(LIBS_COMM) $(LIBS_COMMON)
BENCH_TOOLS += $(BUILD)/bench/bench_planner
# the fused causal attention kernels alone on GPT-mini's shape (docs/benchmarks.md)
$(BUILD)/bench/bench_attention: $(call obj,tests/bench/bench_attention.c) $(LIB_KERN) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_COMMON)
BENCH_TOOLS += $(BUILD)/bench/bench_attention
# the int8 convolution kernels alone on ResNet-8's layer shapes (docs/benchmarks.md)
$(BUILD)/bench/bench_qconv: $(call obj,tests/bench/bench_qconv.c) $(LIB_KERN) $(LIB_COMMON)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_BLAS) $(LIBS_COMMON)
BENCH_TOOLS += $(BUILD)/bench/bench_qconv
# the machine's fp32 multiply-add peak, the roof tests/bench/engine.py reports against
$(BUILD)/bench/fma_peak: $(call obj,tests/bench/fma_peak.c)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^
BENCH_TOOLS += $(BUILD)/bench/fma_peak
bench-tools: $(BENCH_TOOLS)

# the references run side by side: PyTorch 1.13, on OpenBLAS built with OpenMP (Debian's torch
# otherwise runs on the reference BLAS; the pthread OpenBLAS fights torch's OpenMP pool)
bench:
	$(Q)MGE_EXTRA_PKGS="python3-torch libopenblas0-openmp" sh deploy/install-deps.sh
	$(Q)$(MAKE) --no-print-directory binaries bench-tools
	$(Q)sh tests/bench/run.sh $(BUILD)

# ---- what needs a GPU: `make test-gpu`, `make bench-gpu`; each prints a "skip - ..." line and
# succeeds on a machine without nvcc or without a device ----
GPU_TESTS := $(filter $(BUILD)/tests/test_cuda $(BUILD)/tests/test_comm_nccl,$(UNIT_BIN))
test-gpu: deps
	$(Q)$(MAKE) --no-print-directory binaries $(GPU_TESTS)
	$(Q)sh tests/run-gpu.sh $(BUILD)

ifneq ($(CUDA_OBJ),)
$(BUILD)/bench/bench_cuda: $(call obj,tests/bench/bench_cuda.c) $(ENGINE_LIBS)
	@mkdir -p $(dir $@)
	@echo "  LD      $@"
	$(Q)$(CC) $(ALL_LDFLAGS) -o $@ $^ $(LIBS_BLAS) $(LIBS_PROTO) $(LIBS_COMM) $(LIBS_COMMON)
bench-gpu: deps
	$(Q)$(MAKE) --no-print-directory $(BUILD)/bench/bench_cuda
	$(Q)$(BUILD)/bench/bench_cuda
else
bench-gpu:
	@echo "skip - bench-gpu: nvcc not found (CPU-only build): 1 GPU benchmark skipped"
endif

demo: deps
	$(Q)KEEP="$(KEEP)" MAKE="$(MAKE)" sh deploy/demo.sh $(BUILD)

format:
	clang-format -i $$(git ls-files '*.c' '*.h' '*.cu')

clean:
	rm -rf $(BUILD)

-include $(shell find $(BUILD)/obj -name '*.d' 2>/dev/null)
