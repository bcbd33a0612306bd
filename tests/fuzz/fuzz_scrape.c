/*
 * fuzz_scrape.c — libFuzzer target for the Prometheus text `pawl status --metrics` reads from
 * another process's metrics endpoint (tools/scrape.c). Invariant: any body is summarised
 * without a crash or sanitizer report.
 */
#include "scrape.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *text = malloc(size + 1);
    if (text == NULL)
        return 0;
    memcpy(text, data, size);
    text[size] = '\0';
    FILE *f = fopen("/dev/null", "w");
    if (f) {
        tool_scrape_summary(f, text);
        fclose(f);
    }
    free(text);
    return 0;
}
