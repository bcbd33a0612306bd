/*
 * tokens_mem.c — the in-memory token store: claims and tokens for tests and single-process
 * embedders, with the same semantics as the PostgreSQL table.
 *
 * One mutex guards everything; every operation is short. A batch transaction buffers the
 * handlers' statements and the token write and applies them at commit, all under the lock, so
 * the token and the statements' effects (through the exec hook) become visible together or not
 * at all, exactly like the database transaction. The commit re-checks the claim first: a node
 * whose claim was taken gets PAWL_ECLAIM and nothing is applied. Claim times use the monotonic
 * clock (one process). For tests, a fault switch (testctl.h) fails the Nth commit, and a
 * test-control handler hands a claim to another owner.
 */
#include "common.h"
#include "segment.h"
#include "testctl.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct row {
    char proc[PAWL_NAME_MAX + 1];
    struct pawl_segment_status st;
    int64_t claimed_ns;
};

struct node {
    char proc[PAWL_NAME_MAX + 1];
    char id[PAWL_INSTANCE_MAX + 1];
    int64_t seen_ns;
};

struct tokens_mem {
    struct pawl_tokens base;
    pthread_mutex_t mu;
    struct row *rows;
    size_t nrows, cap;
    struct node *nodes;
    size_t nnodes, nodes_cap;
    pawl_tokens_mem_exec_fn exec;
    void *exec_ud;
    char err[512];
};

struct stmt {
    char *sql;
    int nparams;
    char **values;
};

struct txn_mem {
    struct pawl_txn base;
    struct tokens_mem *m;
    char proc[PAWL_NAME_MAX + 1];
    char owner[PAWL_INSTANCE_MAX + 1];
    uint32_t seg_id;
    int has_store;
    int64_t token;
    struct stmt *stmts;
    size_t n, cap;
    int failed; /* an exec could not be queued */
};

static struct tokens_mem *from(struct pawl_tokens *t)
{
    return (struct tokens_mem *)t;
}

static struct row *find(struct tokens_mem *m, const char *proc, uint32_t seg_id)
{
    for (size_t i = 0; i < m->nrows; i++)
        if (m->rows[i].st.seg.id == seg_id && strcmp(m->rows[i].proc, proc) == 0)
            return &m->rows[i];
    return NULL;
}

static int add_row(struct tokens_mem *m, const char *proc, struct pawl_segment seg, int64_t token,
                   int64_t high_water)
{
    if (m->nrows == m->cap) {
        size_t cap = m->cap ? m->cap * 2 : 32;
        struct row *r = pawl_realloc(m->rows, cap * sizeof *r);
        if (r == NULL)
            return PAWL_ENOMEM;
        m->rows = r;
        m->cap = cap;
    }
    struct row *r = &m->rows[m->nrows++];
    memset(r, 0, sizeof *r);
    snprintf(r->proc, sizeof r->proc, "%s", proc);
    r->st.seg = seg;
    r->st.token = token;
    r->st.high_water = high_water;
    r->st.claim_age_ms = -1;
    r->st.mode = -1;
    return 0;
}

static void del_row(struct tokens_mem *m, struct row *r)
{
    size_t i = (size_t)(r - m->rows);
    memmove(&m->rows[i], &m->rows[i + 1], (m->nrows - i - 1) * sizeof *r);
    m->nrows--;
}

static int mem_init(struct pawl_tokens *t, const char *proc, uint32_t n, int64_t token)
{
    struct tokens_mem *m = from(t);
    if (!pawl__segment_count_valid(n))
        return PAWL_EINVAL;
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    int exists = 0;
    for (size_t i = 0; i < m->nrows; i++)
        if (strcmp(m->rows[i].proc, proc) == 0)
            exists = 1;
    /* All segments or none: room for every row first, so that a failed allocation cannot
     * leave part of the hash space without a segment (a later init would find the processor
     * and add nothing). */
    if (!exists && m->nrows + n > m->cap) {
        size_t cap = m->cap ? m->cap : 32;
        while (cap < m->nrows + n)
            cap *= 2;
        struct row *r = pawl_realloc(m->rows, cap * sizeof *r);
        if (r == NULL)
            rc = PAWL_ENOMEM;
        else {
            m->rows = r;
            m->cap = cap;
        }
    }
    for (uint32_t i = 0; !exists && i < n && rc == 0; i++)
        rc = add_row(m, proc, pawl_segment_initial(i, n), token, token);
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int cmp_status(const void *a, const void *b)
{
    const struct pawl_segment_status *x = a, *y = b;
    if (x->seg.mask != y->seg.mask)
        return x->seg.mask < y->seg.mask ? -1 : 1;
    return x->seg.id < y->seg.id ? -1 : x->seg.id > y->seg.id;
}

static void fill_age(struct row *r, int64_t now)
{
    r->st.claim_age_ms = r->st.owner[0] ? (now - r->claimed_ns) / 1000000 : -1;
}

static int mem_list(struct pawl_tokens *t, const char *proc, struct pawl_segment_status **rows,
                    size_t *n)
{
    struct tokens_mem *m = from(t);
    pthread_mutex_lock(&m->mu);
    struct pawl_segment_status *out = pawl_malloc((m->nrows + 1) * sizeof *out);
    if (out == NULL) {
        pthread_mutex_unlock(&m->mu);
        return PAWL_ENOMEM;
    }
    size_t k = 0;
    int64_t now = pawl_now_ns();
    for (size_t i = 0; i < m->nrows; i++) {
        if (strcmp(m->rows[i].proc, proc) != 0)
            continue;
        fill_age(&m->rows[i], now);
        out[k++] = m->rows[i].st;
    }
    pthread_mutex_unlock(&m->mu);
    qsort(out, k, sizeof *out, cmp_status);
    *rows = out;
    *n = k;
    return 0;
}

static int mem_claim(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner,
                     int64_t timeout_ms, int mode, struct pawl_segment_status *out)
{
    struct tokens_mem *m = from(t);
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    struct row *r = find(m, proc, seg_id);
    int64_t now = pawl_now_ns();
    if (r == NULL) {
        rc = PAWL_ENOTFOUND;
    } else if (r->st.owner[0] && strcmp(r->st.owner, owner) != 0 &&
               now - r->claimed_ns < timeout_ms * 1000000) {
        snprintf(m->err, sizeof m->err, "segment %u is held by %s", seg_id, r->st.owner);
        rc = PAWL_EBUSY;
    } else {
        snprintf(r->st.owner, sizeof r->st.owner, "%s", owner);
        r->claimed_ns = now;
        r->st.mode = mode;
        fill_age(r, now);
        if (out)
            *out = r->st;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static void touch_node(struct tokens_mem *m, const char *proc, const char *id, int64_t now)
{
    for (size_t i = 0; i < m->nnodes; i++) {
        if (strcmp(m->nodes[i].id, id) == 0 && strcmp(m->nodes[i].proc, proc) == 0) {
            m->nodes[i].seen_ns = now;
            return;
        }
    }
    if (m->nnodes == m->nodes_cap) {
        size_t cap = m->nodes_cap ? m->nodes_cap * 2 : 8;
        struct node *n = pawl_realloc(m->nodes, cap * sizeof *n);
        if (n == NULL)
            return; /* liveness is advisory; the next extend retries */
        m->nodes = n;
        m->nodes_cap = cap;
    }
    struct node *n = &m->nodes[m->nnodes++];
    snprintf(n->proc, sizeof n->proc, "%s", proc);
    snprintf(n->id, sizeof n->id, "%s", id);
    n->seen_ns = now;
}

static int mem_extend(struct pawl_tokens *t, const char *proc, const char *owner,
                      const uint32_t *ids, size_t n, unsigned char *held)
{
    struct tokens_mem *m = from(t);
    pthread_mutex_lock(&m->mu);
    int64_t now = pawl_now_ns();
    touch_node(m, proc, owner, now);
    for (size_t i = 0; i < n; i++) {
        struct row *r = find(m, proc, ids[i]);
        int mine = r && strcmp(r->st.owner, owner) == 0;
        if (mine)
            r->claimed_ns = now;
        if (held)
            held[i] = (unsigned char)mine;
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int mem_live(struct pawl_tokens *t, const char *proc, const char *me, int64_t timeout_ms,
                    uint32_t *count, uint32_t *rank)
{
    struct tokens_mem *m = from(t);
    pthread_mutex_lock(&m->mu);
    int64_t now = pawl_now_ns();
    uint32_t c = 1, r = 0;
    for (size_t i = 0; i < m->nnodes; i++) {
        struct node *n = &m->nodes[i];
        if (strcmp(n->proc, proc) != 0 || strcmp(n->id, me) == 0)
            continue;
        if (now - n->seen_ns >= timeout_ms * 1000000)
            continue;
        c++;
        if (strcmp(n->id, me) < 0)
            r++;
    }
    pthread_mutex_unlock(&m->mu);
    *count = c;
    *rank = r;
    return 0;
}

static int mem_leave(struct pawl_tokens *t, const char *proc, const char *me)
{
    struct tokens_mem *m = from(t);
    pthread_mutex_lock(&m->mu);
    for (size_t i = 0; i < m->nnodes; i++) {
        if (strcmp(m->nodes[i].id, me) == 0 && strcmp(m->nodes[i].proc, proc) == 0) {
            m->nodes[i] = m->nodes[--m->nnodes];
            break;
        }
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

static int mem_release(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner)
{
    struct tokens_mem *m = from(t);
    pthread_mutex_lock(&m->mu);
    struct row *r = find(m, proc, seg_id);
    if (r && strcmp(r->st.owner, owner) == 0) {
        r->st.owner[0] = '\0';
        r->st.mode = -1;
    }
    pthread_mutex_unlock(&m->mu);
    return 0;
}

/* ---- batch transactions ---- */

static void txn_clear(struct txn_mem *x)
{
    for (size_t i = 0; i < x->n; i++) {
        pawl_free(x->stmts[i].sql);
        for (int k = 0; k < x->stmts[i].nparams; k++)
            pawl_free(x->stmts[i].values[k]);
        pawl_free(x->stmts[i].values);
    }
    pawl_free(x->stmts);
    pawl_free(x);
}

static int txn_exec(struct pawl_txn *t, const char *sql, int nparams, const char *const *values)
{
    struct txn_mem *x = (struct txn_mem *)t;
    if (x->m->exec == NULL)
        return PAWL_ENOTSUP;
    if (sql == NULL || nparams < 0 || (nparams > 0 && values == NULL))
        return PAWL_EINVAL;
    if (x->n == x->cap) {
        size_t cap = x->cap ? x->cap * 2 : 16;
        struct stmt *s = pawl_realloc(x->stmts, cap * sizeof *s);
        if (s == NULL) {
            x->failed = 1;
            return PAWL_ENOMEM;
        }
        x->stmts = s;
        x->cap = cap;
    }
    struct stmt *s = &x->stmts[x->n];
    memset(s, 0, sizeof *s);
    s->sql = pawl__strdup(sql);
    s->values = nparams ? pawl_calloc((size_t)nparams, sizeof(char *)) : NULL;
    if (s->sql == NULL || (nparams && s->values == NULL)) {
        pawl_free(s->sql);
        pawl_free(s->values);
        x->failed = 1;
        return PAWL_ENOMEM;
    }
    x->n++;
    s->nparams = nparams;
    for (int k = 0; k < nparams; k++) {
        if (values[k] && (s->values[k] = pawl__strdup(values[k])) == NULL) {
            x->failed = 1;
            return PAWL_ENOMEM;
        }
    }
    return 0;
}

static int txn_store(struct pawl_txn *t, int64_t token)
{
    struct txn_mem *x = (struct txn_mem *)t;
    x->has_store = 1;
    if (token > x->token)
        x->token = token;
    return 0;
}

static int txn_commit(struct pawl_txn *t)
{
    struct txn_mem *x = (struct txn_mem *)t;
    struct tokens_mem *m = x->m;
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    struct row *r = find(m, x->proc, x->seg_id);
    if (x->failed) {
        snprintf(m->err, sizeof m->err, "a statement could not be queued");
        rc = PAWL_ENOMEM;
    } else if (pawl__fault_sim(PAWL_FAULT_TOKENS_MEM_COMMIT, &m->base)) {
        snprintf(m->err, sizeof m->err, "injected commit failure");
        rc = PAWL_ECONN;
    } else if (r == NULL || strcmp(r->st.owner, x->owner) != 0) {
        snprintf(m->err, sizeof m->err, "segment %u of %s is no longer held by %s", x->seg_id,
                 x->proc, x->owner);
        rc = PAWL_ECLAIM;
    } else {
        for (size_t i = 0; i < x->n && rc == 0; i++) {
            struct stmt *s = &x->stmts[i];
            if (m->exec(m->exec_ud, s->sql, s->nparams, (const char *const *)s->values) != 0) {
                snprintf(m->err, sizeof m->err, "statement failed: %.400s", s->sql);
                rc = PAWL_ESQL;
            }
        }
        if (rc == 0 && x->has_store && x->token > r->st.token) {
            r->st.token = x->token;
            if (r->st.token > r->st.high_water)
                r->st.high_water = r->st.token;
            if (r->st.has_merge && r->st.token >= r->st.merge_token)
                r->st.has_merge = 0;
        }
    }
    pthread_mutex_unlock(&m->mu);
    txn_clear(x);
    return rc;
}

static void txn_rollback(struct pawl_txn *t)
{
    txn_clear((struct txn_mem *)t);
}

static const struct pawl_txn_ops txn_ops = {
    .exec = txn_exec,
    .store = txn_store,
    .commit = txn_commit,
    .rollback = txn_rollback,
};

static int mem_begin(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner,
                     struct pawl_txn **out)
{
    struct txn_mem *x = pawl_calloc(1, sizeof *x);
    if (x == NULL)
        return PAWL_ENOMEM;
    x->base.ops = &txn_ops;
    x->m = from(t);
    snprintf(x->proc, sizeof x->proc, "%s", proc);
    snprintf(x->owner, sizeof x->owner, "%s", owner);
    x->seg_id = seg_id;
    x->token = INT64_MIN;
    *out = &x->base;
    return 0;
}

/* ---- split, merge, reset ---- */

/* PAWL_EBUSY unless r is unowned or owned by owner (NULL: unowned only). */
static int check_free(struct tokens_mem *m, struct row *r, const char *owner)
{
    if (r->st.owner[0] == '\0' || (owner && strcmp(r->st.owner, owner) == 0))
        return 0;
    snprintf(m->err, sizeof m->err, "segment %u is claimed by %s", r->st.seg.id, r->st.owner);
    return PAWL_EBUSY;
}

static int mem_split(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner)
{
    struct tokens_mem *m = from(t);
    int rc;
    pthread_mutex_lock(&m->mu);
    struct row *r = find(m, proc, seg_id);
    struct pawl_segment lo, hi;
    if (r == NULL) {
        snprintf(m->err, sizeof m->err, "no segment %u in %s", seg_id, proc);
        rc = PAWL_ENOTFOUND;
    } else if ((rc = check_free(m, r, owner)) == 0 &&
               (rc = pawl_segment_split(r->st.seg, &lo, &hi)) == 0) {
        struct pawl_segment_status old = r->st;
        int64_t tlo = old.token, thi = old.token;
        /* A pending merge ends here: the faster half already covers up to merge_token. */
        if (old.has_merge && old.merge_seg.id == lo.id && old.merge_seg.mask == lo.mask)
            tlo = PAWL_MAX(tlo, old.merge_token);
        if (old.has_merge && old.merge_seg.id == hi.id && old.merge_seg.mask == hi.mask)
            thi = PAWL_MAX(thi, old.merge_token);
        del_row(m, r);
        rc = add_row(m, proc, lo, tlo, old.high_water);
        if (rc == 0)
            rc = add_row(m, proc, hi, thi, old.high_water);
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int mem_merge(struct pawl_tokens *t, const char *proc, uint32_t seg_id, const char *owner)
{
    struct tokens_mem *m = from(t);
    int rc;
    pthread_mutex_lock(&m->mu);
    struct row *a = find(m, proc, seg_id), *b = NULL;
    struct pawl_segment sib, parent;
    if (a == NULL) {
        snprintf(m->err, sizeof m->err, "no segment %u in %s", seg_id, proc);
        rc = PAWL_ENOTFOUND;
        goto out;
    }
    if ((rc = pawl_segment_sibling(a->st.seg, &sib)) != 0)
        goto out;
    b = find(m, proc, sib.id);
    if (b == NULL || b->st.seg.mask != sib.mask) {
        snprintf(m->err, sizeof m->err, "segment %u has no sibling %u of mask %u (split further?)",
                 seg_id, sib.id, sib.mask);
        rc = PAWL_ENOTFOUND;
        goto out;
    }
    if ((rc = check_free(m, a, owner)) != 0 || (rc = check_free(m, b, owner)) != 0)
        goto out;
    if (a->st.has_merge || b->st.has_merge) {
        snprintf(m->err, sizeof m->err, "a merge into segment %u or %u is still catching up",
                 a->st.seg.id, b->st.seg.id);
        rc = PAWL_EBUSY;
        goto out;
    }
    pawl_segment_parent(a->st.seg, &parent);
    struct pawl_segment_status x = a->st, y = b->st;
    del_row(m, a);
    b = find(m, proc, sib.id);
    del_row(m, b);
    rc = add_row(m, proc, parent, PAWL_MIN(x.token, y.token), PAWL_MAX(x.high_water, y.high_water));
    if (rc == 0 && x.token != y.token) {
        struct row *p = find(m, proc, parent.id);
        p->st.has_merge = 1;
        p->st.merge_seg = x.token > y.token ? x.seg : y.seg;
        p->st.merge_token = PAWL_MAX(x.token, y.token);
    }
out:
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static int mem_reset(struct pawl_tokens *t, const char *proc, int64_t token)
{
    struct tokens_mem *m = from(t);
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    size_t off = 0;
    m->err[0] = '\0';
    for (size_t i = 0; i < m->nrows; i++) {
        struct row *r = &m->rows[i];
        if (strcmp(r->proc, proc) == 0 && r->st.owner[0]) {
            if (rc == 0)
                off = (size_t)snprintf(m->err, sizeof m->err, "claimed:");
            if (off < sizeof m->err)
                off += (size_t)snprintf(m->err + off, sizeof m->err - off, " %u by %s",
                                        r->st.seg.id, r->st.owner);
            rc = PAWL_EBUSY;
        }
    }
    for (size_t i = 0; rc == 0 && i < m->nrows; i++) {
        struct row *r = &m->rows[i];
        if (strcmp(r->proc, proc) != 0)
            continue;
        r->st.token = token;
        r->st.has_merge = 0;
        if (token > r->st.high_water)
            r->st.high_water = token;
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

static const char *mem_errmsg(struct pawl_tokens *t)
{
    return from(t)->err;
}

static void mem_free(struct pawl_tokens *t)
{
    struct tokens_mem *m = from(t);
    pawl__fault_forget(t);
    pawl_free(m->rows);
    pawl_free(m->nodes);
    pthread_mutex_destroy(&m->mu);
    pawl_free(m);
}

static const struct pawl_tokens_ops mem_ops = {
    .init = mem_init,
    .list = mem_list,
    .claim = mem_claim,
    .extend = mem_extend,
    .live = mem_live,
    .leave = mem_leave,
    .release = mem_release,
    .begin = mem_begin,
    .split = mem_split,
    .merge = mem_merge,
    .reset = mem_reset,
    .errmsg = mem_errmsg,
    .free = mem_free,
};

/* PAWL_TESTCTL_TOKENS_MEM_STEAL's end (installed by pawl_tokens_mem_new; see testctl.h). */
static int steal(va_list ap)
{
    struct pawl_tokens *t = va_arg(ap, struct pawl_tokens *);
    const char *proc = va_arg(ap, const char *);
    uint32_t seg_id = va_arg(ap, uint32_t);
    const char *thief = va_arg(ap, const char *);
    if (t == NULL || t->ops != &mem_ops || proc == NULL || thief == NULL)
        return PAWL_EINVAL;
    struct tokens_mem *m = from(t);
    int rc = 0;
    pthread_mutex_lock(&m->mu);
    struct row *r = find(m, proc, seg_id);
    if (r == NULL) {
        rc = PAWL_ENOTFOUND;
    } else {
        snprintf(r->st.owner, sizeof r->st.owner, "%s", thief);
        r->claimed_ns = pawl_now_ns();
    }
    pthread_mutex_unlock(&m->mu);
    return rc;
}

int pawl_tokens_mem_new(struct pawl_tokens **out)
{
    struct tokens_mem *m = pawl_calloc(1, sizeof *m);
    if (m == NULL)
        return PAWL_ENOMEM;
    m->base.ops = &mem_ops;
    pthread_mutex_init(&m->mu, NULL);
    pawl__testctl_install(PAWL_TESTCTL_TOKENS_MEM_STEAL, steal);
    *out = &m->base;
    return 0;
}

void pawl_tokens_mem_set_exec(struct pawl_tokens *t, pawl_tokens_mem_exec_fn fn, void *ud)
{
    struct tokens_mem *m = from(t);
    pthread_mutex_lock(&m->mu);
    m->exec = fn;
    m->exec_ud = ud;
    pthread_mutex_unlock(&m->mu);
}

void pawl_tokens_free(struct pawl_tokens *t)
{
    if (t)
        t->ops->free(t);
}

const char *pawl_tokens_errmsg(struct pawl_tokens *t, char *buf, size_t len)
{
    if (len > 0)
        snprintf(buf, len, "%s", t ? t->ops->errmsg(t) : "");
    return buf;
}

void pawl_tokens_rows_free(struct pawl_segment_status *rows)
{
    pawl_free(rows);
}
