/*
 * filter.h — private helpers of the read filters (filter.c).
 */
#ifndef PAWL_STORE_FILTER_H
#define PAWL_STORE_FILTER_H

#include <stddef.h>

/* v[0..n) as a PostgreSQL text[] literal ({"a","b\"c"}), allocated with pawl_malloc; NULL when
 * n is 0 or memory ran out (the caller tells them apart by n). */
char *pawl__filter_array_literal(const char *const *v, size_t n);

#endif
