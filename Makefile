# The two commands of the quick start, on a fresh Debian 12 machine (as root):
#   make demo   install what is missing, build, start the private PostgreSQL, run `pawl demo`
#               (in its own database, pawl_demo)
#   make test   the same set-up, clang-format and clang-tidy, then every test suite (plain,
#               ASan+UBSan, TSan)
# Other targets: build, deps, pg-start, pg-stop, pg-remove, bench, soak, install, clean.

SHELL := /bin/bash
JOBS ?= $(shell nproc 2>/dev/null || echo 2)
BUILD ?= build
CMAKE_FLAGS ?=
CTEST := ctest --output-on-failure --no-tests=error -j$(JOBS)
PG := tools/pawl-pg

# Debian packages the build, the tests and the benchmarks need.
DEB_PACKAGES := build-essential cmake pkg-config clang libclang-rt-14-dev clang-format clang-tidy \
	liburing-dev libpq-dev libjemalloc-dev libck-dev libcmocka-dev libbenchmark-dev \
	libjansson-dev libmicrohttpd-dev postgresql-15 postgresql-client-15 postgresql-server-dev-15 \
	gnuplot-nox \
	iproute2 util-linux procps jq

.PHONY: all deps build native demo test test-plain test-asan test-tsan fuzz pg-start pg-stop pg-remove \
	bench bench-suite soak install clean check-format tidy tidy-fast

all: build

# Install only what is missing; `apt-get update` runs once, and only when something is.
deps:
	@missing=""; for p in $(DEB_PACKAGES); do \
		dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "install ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
		echo "installing:$$missing"; \
		if [ "$$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi; \
		$$SUDO apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing; \
	fi

$(BUILD)/CMakeCache.txt:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j$(JOBS)
	$(MAKE) native

# The server extension (sql/native, PGXS) for the PostgreSQL 15 the private cluster runs: built
# out of the source tree into $(BUILD)/native and installed into the server's folders, which
# needs root (or write access there). Without them it says so and pawl uses its portable SQL
# functions (`pawl init` chooses whichever the server offers).
PG_CONFIG ?= /usr/lib/postgresql/15/bin/pg_config
native:
	@if [ ! -x $(PG_CONFIG) ]; then \
		echo "native: $(PG_CONFIG) not found (install postgresql-server-dev-15): pawl will use its SQL functions"; \
	else \
		mkdir -p $(BUILD)/native && \
		$(MAKE) -s -C $(BUILD)/native -f $(CURDIR)/sql/native/Makefile VPATH=$(CURDIR)/sql/native \
			PG_CONFIG=$(PG_CONFIG) && \
		if [ -w "$$($(PG_CONFIG) --pkglibdir)" ]; then \
			$(MAKE) -s -C $(BUILD)/native -f $(CURDIR)/sql/native/Makefile \
				VPATH=$(CURDIR)/sql/native PG_CONFIG=$(PG_CONFIG) install && \
			echo "native: pawl_native installed into $$($(PG_CONFIG) --pkglibdir)"; \
		else \
			echo "native: cannot write $$($(PG_CONFIG) --pkglibdir) (run as root to install pawl_native): pawl will use its SQL functions"; \
		fi; \
	fi

pg-start: deps
	$(PG) start

pg-stop:
	$(PG) stop

pg-remove:
	$(PG) remove

# The demo appends to a database of its own (DEMO_DB) in the private PostgreSQL, so that the
# README's tour, run next, starts on an empty log in the default database.
DEMO_DB ?= pawl_demo
demo: build pg-start
	@[ "$$($(PG) psql -qAtc "SELECT 1 FROM pg_database WHERE datname = '$(DEMO_DB)'")" = 1 ] || \
		$(PG) psql -qc 'CREATE DATABASE $(DEMO_DB)'
	PAWL_DSN="$$($(PG) dsn) dbname=$(DEMO_DB)" $(BUILD)/bin/pawl demo $(DEMO_ARGS)

# Every suite: the plain build runs unit, pg, stress and fault; the sanitizer builds run the
# suites that exercise concurrency and memory (pg included under ASan, but not the *_sql reruns
# of the portable server path: the client code they run is the same on both paths). It ends with the tests
# ctest skipped in each stage and why (tools/test-summary.sh), also when a stage failed. Each
# stage's ctest runs with PAWL_REQUIRE_IO_URING=1 where the kernel allows io_uring (unless set
# already), so that an io_uring case skips only where the kernel refuses io_uring.
test: deps
	$(MAKE) check-format
	$(MAKE) tidy-fast
	@stamp=$$(mktemp); rc=0; \
	for t in test-plain test-asan test-tsan fuzz; do $(MAKE) $$t || { rc=$$?; break; }; done; \
	tools/test-summary.sh --since $$stamp plain=$(BUILD) asan=build-asan tsan=build-tsan; \
	rm -f $$stamp; exit $$rc

test-plain: build
	cd $(BUILD) && env $$($(CURDIR)/tools/test-summary.sh uring-env .) \
		$(CTEST) --output-junit Testing/junit.xml

test-asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DPAWL_SANITIZE=address,undefined \
		-DPAWL_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build build-asan -j$(JOBS)
	cd build-asan && env $$($(CURDIR)/tools/test-summary.sh uring-env .) \
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		$(CTEST) -L 'unit|stress|pg|fault' -E '_sql$$' --output-junit Testing/junit.xml

test-tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAWL_SANITIZE=thread \
		-DPAWL_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build build-tsan -j$(JOBS)
	cd build-tsan && env $$($(CURDIR)/tools/test-summary.sh uring-env .) \
		TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
		$(CTEST) -L 'unit|stress' --output-junit Testing/junit.xml

# libFuzzer targets (tests/fuzz/): built with clang, fuzzer + ASan + UBSan, into build-fuzz; each
# runs FUZZ_SECONDS from its committed seed corpus (new inputs go to build-fuzz/corpus/, crashes to
# build-fuzz/crashes/). Any crash fails the target; add the input to tests/fuzz/corpus/NAME/.
# The summary gives each target's executions and executions per second. A target slower than
# FUZZ_MIN_EXEC_S fails too: a harness or a parser that became dear per input (a lookup gone
# quadratic, a connection attempt) fuzzes next to nothing in its minute and passes unnoticed
# otherwise. Every target runs above 10,000/s on an idle 2-core machine: the floor leaves 5x for a
# shared CI machine and still fails a target whose inputs cost half a millisecond or more. Runs
# shorter than 30 s are mostly start-up (loading the corpus): the floor is not applied to them.
FUZZ_SECONDS ?= 60
FUZZ_MIN_EXEC_S ?= 2000
FUZZ_TARGETS = $(patsubst tests/fuzz/fuzz_%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
fuzz: deps
	CC=clang CXX=clang++ cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPAWL_FUZZ=ON \
		-DPAWL_BUILD_BENCH=OFF $(CMAKE_FLAGS)
	cmake --build build-fuzz -j$(JOBS) --target fuzz_all
	@mkdir -p build-fuzz/crashes; summary=; slow=; for t in $(FUZZ_TARGETS); do \
		mkdir -p build-fuzz/corpus/$$t; \
		dict=; [ -f tests/fuzz/$$t.dict ] && dict=-dict=tests/fuzz/$$t.dict; \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
		ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
		build-fuzz/fuzz/fuzz_$$t -max_total_time=$(FUZZ_SECONDS) -max_len=4096 -timeout=10 \
			-rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build-fuzz/crashes/$$t- $$dict \
			build-fuzz/corpus/$$t tests/fuzz/corpus/$$t 2>build-fuzz/$$t.log \
			|| { tail -60 build-fuzz/$$t.log; echo "fuzz: $$t FAILED (log: build-fuzz/$$t.log)"; exit 1; }; \
		runs=$$(sed -n 's/^stat::number_of_executed_units: *//p' build-fuzz/$$t.log); \
		rate=$$(sed -n 's/^stat::average_exec_per_sec: *//p' build-fuzz/$$t.log); \
		new=$$(sed -n 's/^stat::new_units_added: *//p' build-fuzz/$$t.log); \
		line=$$(printf '%-8s %11s executions %8s exec/s %6s new inputs' $$t "$${runs:-?}" "$${rate:-?}" "$${new:-?}"); \
		echo "fuzz: $$line"; summary="$$summary  $$line"$$'\n'; \
		[ "$${rate:-0}" -ge $(FUZZ_MIN_EXEC_S) ] 2>/dev/null || slow="$$slow $$t"; \
	done; \
	floor="floor $(FUZZ_MIN_EXEC_S) exec/s"; \
	if [ $(FUZZ_SECONDS) -lt 30 ]; then floor="no floor below 30 s"; slow=; fi; \
	echo "fuzz: summary ($(FUZZ_SECONDS) s per target, $$floor):"; \
	printf '%s' "$$summary"; \
	if [ -n "$$slow" ]; then \
		echo "fuzz: FAILED: below $(FUZZ_MIN_EXEC_S) executions/s:$$slow (logs: build-fuzz/NAME.log)"; exit 1; \
	fi

bench: build pg-start
	$(BUILD)/bin/pawl bench $(BENCH_ARGS)

# Every benchmark of the README's table in one run (BENCH_SUITE_ARGS=--quick for a short one).
bench-suite: build pg-start
	PAWL_BIN=$(BUILD)/bin bench/run.sh $(BENCH_SUITE_ARGS)

# The chaos run of the fault suite (tests/fault/chaos/chaos.sh), for DURATION seconds (default
# 1800): appenders and processors SIGKILLed and restarted, backends terminated, PostgreSQL
# restarted (fast, then immediate); prints the faults injected and the checks passed.
DURATION ?= 1800
soak: build
	PAWL_BIN=$(CURDIR)/$(BUILD)/bin CHAOS_BIN=$(CURDIR)/$(BUILD)/tests PAWL_PG=$(CURDIR)/$(PG) \
		bash tests/fault/chaos/chaos.sh $(DURATION)

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-fuzz

# The checked-in .clang-format and .clang-tidy (tools/check-style.sh says what deviates). tidy
# needs the build's compile_commands.json (and its generated headers), so it builds first.
# tidy-fast (in `make test`) leaves out the static analyzer, which costs minutes of CPU; tidy
# runs it too: run it before a merge.
check-format: deps
	tools/check-style.sh format

tidy: build
	tools/check-style.sh tidy $(BUILD) $(JOBS)

tidy-fast: build
	tools/check-style.sh tidy-fast $(BUILD) $(JOBS)
