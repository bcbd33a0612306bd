/*
 * scrape.h — reading another pawl process's metrics endpoint (for `pawl status --metrics
 * --metrics-port N`): one HTTP GET on 127.0.0.1, then the Prometheus text is summarised: every
 * counter and gauge, and for each histogram its count and p50 / p99 / p99.9 estimated from the
 * cumulative `le` buckets by linear interpolation (as PromQL's histogram_quantile does). Used from
 * one thread.
 */
#ifndef PAWL_TOOL_SCRAPE_H
#define PAWL_TOOL_SCRAPE_H

#include <stddef.h>
#include <stdio.h>

/* GET http://127.0.0.1:port/metrics; the body (malloc'd, NUL-terminated) in *body. */
int tool_scrape(int port, char **body, char *err, size_t errlen);

/* Print a human summary of Prometheus text to f. */
void tool_scrape_summary(FILE *f, const char *text);

/* The q-quantile of a histogram given as parallel arrays of upper bounds and cumulative counts
 * (the last bound +Inf); NaN when empty. Exposed for tests. */
double tool_hist_quantile(const double *le, const double *cum, size_t n, double q);

#endif
