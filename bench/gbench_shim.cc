// gbench_shim.cc — the C++ adapter behind gbench_shim.h: the opaque pawl_bench_state is a
// benchmark::State and pawl_bench is a benchmark::internal::Benchmark.
#include "gbench_shim.h"

#include <benchmark/benchmark.h>

#include <string>

static benchmark::State &S(pawl_bench_state *st)
{
    return *reinterpret_cast<benchmark::State *>(st);
}

static benchmark::internal::Benchmark *B(pawl_bench *b)
{
    return reinterpret_cast<benchmark::internal::Benchmark *>(b);
}

extern "C" {

pawl_bench *pawl_bench_register(const char *name, pawl_bench_fn fn, void *arg)
{
    auto *b =
        benchmark::RegisterBenchmark(std::string(name).c_str(), [fn, arg](benchmark::State &s) {
            fn(reinterpret_cast<pawl_bench_state *>(&s), arg);
        });
    return reinterpret_cast<pawl_bench *>(b);
}

pawl_bench *pawl_bench_arg(pawl_bench *b, int64_t value)
{
    B(b)->Arg(value);
    return b;
}

pawl_bench *pawl_bench_use_real_time(pawl_bench *b)
{
    B(b)->UseRealTime();
    return b;
}

pawl_bench *pawl_bench_min_time(pawl_bench *b, double seconds)
{
    B(b)->MinTime(seconds);
    return b;
}

pawl_bench *pawl_bench_unit_ns(pawl_bench *b)
{
    B(b)->Unit(benchmark::kNanosecond);
    return b;
}

pawl_bench *pawl_bench_unit_us(pawl_bench *b)
{
    B(b)->Unit(benchmark::kMicrosecond);
    return b;
}

int pawl_bench_keep_running(pawl_bench_state *st)
{
    return S(st).KeepRunning() ? 1 : 0;
}

void pawl_bench_pause(pawl_bench_state *st)
{
    S(st).PauseTiming();
}

void pawl_bench_resume(pawl_bench_state *st)
{
    S(st).ResumeTiming();
}

int64_t pawl_bench_range(pawl_bench_state *st, int index)
{
    return S(st).range(static_cast<std::size_t>(index));
}

int64_t pawl_bench_iterations(pawl_bench_state *st)
{
    return static_cast<int64_t>(S(st).iterations());
}

void pawl_bench_set_items_processed(pawl_bench_state *st, int64_t items)
{
    S(st).SetItemsProcessed(items);
}

void pawl_bench_skip_with_error(pawl_bench_state *st, const char *msg)
{
    S(st).SkipWithError(msg);
}

void pawl_bench_counter(pawl_bench_state *st, const char *name, double value,
                        enum pawl_bench_counter_kind kind)
{
    benchmark::Counter::Flags f = benchmark::Counter::kDefaults;
    if (kind == PAWL_BENCH_COUNTER_RATE)
        f = benchmark::Counter::kIsRate;
    else if (kind == PAWL_BENCH_COUNTER_AVG)
        f = benchmark::Counter::kAvgIterations;
    S(st).counters[name] = benchmark::Counter(value, f);
}

int pawl_bench_main(int argc, char **argv)
{
    benchmark::Initialize(&argc, argv);
    if (benchmark::ReportUnrecognizedArguments(argc, argv))
        return 1;
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
    return 0;
}

} // extern "C"
