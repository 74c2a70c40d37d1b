# Two commands on a fresh machine: `make run` and `make test`. Both run the idempotent set-up
# (scripts/setup.sh: Debian packages + LibTorch in a cached virtualenv), configure, and build.
BUILD_DIR ?= build
BUILD_TYPE ?= Release
JOBS ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all setup configure build run test bench clean

all: build

setup:
	@bash scripts/setup.sh $(BUILD_DIR)

configure: setup
	@. ./$(BUILD_DIR)/setup.env && cmake -S . -B $(BUILD_DIR) -G Ninja \
	  -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) \
	  -DCMAKE_PREFIX_PATH="$$TORCH_PREFIX" \
	  -DLOSSFNS_PYTHON="$$LOSSFNS_PYTHON" \
	  -DLOSSFNS_SMOLLM2_DIR="$$LOSSFNS_SMOLLM2_DIR" \
	  -DLOSSFNS_SETUP_CHECKS="$$LOSSFNS_SETUP_CHECKS" \
	  $(CMAKE_ARGS)

build: configure
	@cmake --build $(BUILD_DIR) -j $(JOBS)

run: build
	@./$(BUILD_DIR)/trainer/distill_trainer

test: build
	@ctest --test-dir $(BUILD_DIR) --output-on-failure -j $(JOBS)

bench: build
	@./$(BUILD_DIR)/bench/tvd_bench

clean:
	rm -rf $(BUILD_DIR)
