/* The compiled fast path of ingest: one span of traceEvents (a JSON array of event objects) -> column buffers.
 *
 * _columns.decode_span calls scan_events(document, keys, types) first. It validates the whole span as strict
 * JSON and, in one pass with the GIL released, pulls out what _columns' Python path would: ph, cat, name,
 * pid, tid, id, bp as text, ts/dur as exact integer ns, the raw args text, and the value of every raw args
 * key of the declarative table (schema.ARG_COLUMNS, passed in as `keys` with their `types`).
 *
 * It handles only what it can read exactly as the Python path does, and returns None for anything else
 * (the span then takes the Python path, which also reports errors):
 *   - malformed JSON (a byte that is not UTF-8 outside a string included), a \u escape that is a lone
 *     surrogate, nesting deeper than 64;
 *   - an entry that is not an object, a key written with escapes, a known key twice in one object;
 *   - ts/dur other than a number with at most 3 decimals and no exponent (or null), or beyond int64 ns;
 *   - text fields (ph ... bp, str args) holding a float, an object, an array, an integer beyond int64 or -0
 *     (booleans too, outside str args); numeric args holding an object, an array, a number beyond a double's
 *     range or a string other than a plain number; float args an integer beyond int64, int args one of more
 *     than 20 digits.
 * So every number beyond int64 or a double, read or refused, is the Python path's (the rule is in _coerce.py).
 *
 * Bytes that are not UTF-8 inside a string (some torch builds write garbage into names) are read as
 * bytes.decode("utf-8", "replace") reads them, each maximal invalid subpart one U+FFFD, in the values and in
 * the raw args text alike (see _utf8.py); the strings that held any are counted, and the first invalid byte's
 * offset kept. Such a byte in a key, or in a number written as a string, is left to the Python path.
 *
 * `types` holds one code per key, T_INT ... T_JSON; any other code is a ValueError.
 *
 * scan_events(document, keys, types, start, end) reads document[start:end] as the body of an array (whole
 * events and the commas between them, no brackets): a span of a larger document, read in place, so that
 * spans of one buffer can be scanned by several threads at once.
 *
 * Output, all little-endian Arrow buffers, each a read-only buffer object (validity: one bit per row, 1 = present):
 *   (n, ph, cat, name, pid, tid, id, bp, args, ts_ns, dur_ns, slots, bad_strings, first_bad)
 *   text column: None (no row has a value) or (offsets int64[n + 1], data, validity); the base fields (ph ...
 *   args) as Arrow string views instead: (views [n] of 16 bytes, data, validity)
 *   ts_ns/dur_ns: (values int64[n], validity)
 *   slots: one entry per key: None, or for int/float keys (values int64/float64[n], validity),
 *          for str/json keys a text column as above.
 *   bad_strings: how many strings held bytes that are not UTF-8; first_bad: the offset of the first such byte
 *   from document[start] (-1: none).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <locale.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef _WIN32
#define GUARDS 1
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <unistd.h>
#endif

#define MAX_DEPTH 64
#define MAX_KEYS 128

enum { T_INT = 0, T_FLOAT = 1, T_STR = 2, T_JSON = 3 };
/* base fields of an event object */
enum { F_PH, F_CAT, F_NAME, F_PID, F_TID, F_ID, F_BP, F_ARGS, N_TEXT, F_TS = N_TEXT, F_DUR, N_FIELDS };

/* ------------------------------------------------------------------------------------------------ buffers */

typedef struct {
    char *p;
    size_t len, cap;
} Buf;

static int buf_grow(Buf *b, size_t extra) {
    if (b->len + extra <= b->cap) return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + extra) cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
    return 0;
}

static inline int buf_put(Buf *b, const void *src, size_t n) {
    if (buf_grow(b, n)) return -1;
    memcpy(b->p + b->len, src, n);
    b->len += n;
    return 0;
}

/* A value seen at a row, kept until the row count is known (then densified). Text values point into the
 * input: `esc` says whether JSON escapes must be decoded; numbers are already converted. */
typedef struct {
    int64_t row;
    union {
        int64_t i;
        double f;
        struct {
            uint32_t off, len;
        } s;
    } v;
    uint8_t esc;
} Entry;

typedef struct {
    Buf entries; /* Entry[] */
    int type;    /* T_* (base text fields are T_STR) */
} Column;

static inline int col_add(Column *c, Entry *e) { return buf_put(&c->entries, e, sizeof(Entry)); }

/* ------------------------------------------------------------------------------------------------ scanner */

typedef struct {
    const unsigned char *base, *p, *end;
    int depth;
    int64_t bad_strings;            /* strings holding bytes that are not UTF-8 */
    const unsigned char *first_bad; /* the first such byte; NULL before it */
} Scan;

/* How a string's bytes are copied out (an Entry's `esc`, text_put's `flags`): as they are (0), with JSON escapes
 * decoded, with invalid UTF-8 replaced (a string body: escapes decoded too), or a raw JSON value's text with
 * invalid UTF-8 replaced inside its strings (escapes kept). */
enum { ESC_ESCAPES = 1, ESC_BAD = 2, RAW_BAD = 4 };
/* U+FFFD is 3 bytes: the most an invalid byte becomes */
#define REPAIRED_MAX(len, flags) ((flags) & (ESC_BAD | RAW_BAD) ? 3 * (len) : (len))

enum { OK = 0, BAIL = 1, NOMEM = 2 };

static inline void ws(Scan *s) {
    while (s->p < s->end && (*s->p == ' ' || *s->p == '\n' || *s->p == '\r' || *s->p == '\t')) s->p++;
}

static inline int hexval(unsigned char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

static int read_hex4(const unsigned char *p, const unsigned char *end, unsigned *out) {
    if (end - p < 4) return -1;
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        int h = hexval(p[i]);
        if (h < 0) return -1;
        v = v * 16 + (unsigned)h;
    }
    *out = v;
    return 0;
}

/* Past the run of plain ASCII string bytes at p (none of '"', '\\', a control character or a byte >= 0x80),
 * eight bytes at a time: the word tests below are exact about whether any byte of the word matches (a
 * borrow can only mark bytes above a true match, so on a little-endian machine the lowest mark is the first
 * match). Kernel and operator names run to hundreds of plain bytes. */
static inline const unsigned char *plain_ascii_run(const unsigned char *p, const unsigned char *end) {
    const uint64_t ones = 0x0101010101010101ULL, highs = 0x8080808080808080ULL;
    while (end - p >= 8) {
        uint64_t x, quote, backslash;
        memcpy(&x, p, 8);
        quote = x ^ (ones * '"');
        backslash = x ^ (ones * '\\');
        uint64_t marks = (x | ((x - ones * 0x20) & ~x) | ((quote - ones) & ~quote) |
                          ((backslash - ones) & ~backslash)) & highs;
        if (marks) {
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
            p += (unsigned)__builtin_ctzll(marks) >> 3;
#endif
            return p;
        }
        p += 8;
    }
    return p;
}

/* The UTF-8 sequence at p (p[0] >= 0x80): its length when *valid, else the length of the maximal invalid
 * subpart there, which Python's "replace" makes one U+FFFD of (overlong forms, surrogates and code points above
 * U+10FFFF are invalid: their first byte alone, or the bytes up to the first that cannot follow). */
static inline size_t utf8_sequence(const unsigned char *p, const unsigned char *end, int *valid) {
    unsigned char c = p[0], lo = 0x80, hi = 0xBF;
    size_t need;
    *valid = 0;
    if (c >= 0xC2 && c <= 0xDF) {
        need = 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        return 1;
    }
    if (end - p < 2 || p[1] < lo || p[1] > hi) return 1;
    for (size_t i = 2; i < need; i++)
        if ((size_t)(end - p) <= i || (p[i] & 0xC0) != 0x80) return i;
    *valid = 1;
    return need;
}

/* A string at s->p ('"'): validated (escapes, surrogate pairs, no control characters; bytes that are not
 * UTF-8 set ESC_BAD in *esc and are counted); on return start and len cover the bytes between the quotes and
 * s->p is past the closing quote. */
static int scan_string(Scan *s, const unsigned char **start, size_t *len, int *esc) {
    const unsigned char *p = s->p + 1, *end = s->end, *bad = NULL;
    *start = p;
    *esc = 0;
    while (p < end) {
        p = plain_ascii_run(p, end);
        if (p >= end) break;
        unsigned char c = *p;
        if (c == '"') {
            *len = (size_t)(p - *start);
            s->p = p + 1;
            if (bad) {
                *esc |= ESC_BAD;
                s->bad_strings++;
                if (!s->first_bad) s->first_bad = bad;
            }
            return OK;
        }
        if (c < 0x20) return BAIL;
        if (c == '\\') {
            *esc |= ESC_ESCAPES;
            if (p + 1 >= end) return BAIL;
            unsigned char e = p[1];
            if (e == 'u') {
                unsigned u;
                if (read_hex4(p + 2, end, &u)) return BAIL;
                p += 6;
                if (u >= 0xD800 && u <= 0xDBFF) {
                    unsigned lo;
                    if (end - p < 6 || p[0] != '\\' || p[1] != 'u' || read_hex4(p + 2, end, &lo)) return BAIL;
                    if (lo < 0xDC00 || lo > 0xDFFF) return BAIL;
                    p += 6;
                } else if (u >= 0xDC00 && u <= 0xDFFF) {
                    return BAIL;
                }
                continue;
            }
            if (!(e == '"' || e == '\\' || e == '/' || e == 'b' || e == 'f' || e == 'n' || e == 'r' || e == 't'))
                return BAIL;
            p += 2;
            continue;
        }
        if (c < 0x80) {
            p++;
            continue;
        }
        int valid;
        size_t n = utf8_sequence(p, end, &valid);
        if (!valid && !bad) bad = p;
        p += n;
    }
    return BAIL; /* unterminated */
}

/* A JSON number at s->p, by the grammar -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)? */
typedef struct {
    const unsigned char *start;
    size_t len;
    int neg, is_int, has_exp;
    const unsigned char *int_start, *frac_start;
    size_t int_len, frac_len;
} Number;

static int scan_number(Scan *s, Number *n) {
    const unsigned char *p = s->p, *end = s->end;
    memset(n, 0, sizeof *n);
    n->start = p;
    if (p < end && *p == '-') {
        n->neg = 1;
        p++;
    }
    n->int_start = p;
    if (p >= end) return BAIL;
    if (*p == '0') {
        p++;
    } else if (*p >= '1' && *p <= '9') {
        while (p < end && *p >= '0' && *p <= '9') p++;
    } else {
        return BAIL;
    }
    n->int_len = (size_t)(p - n->int_start);
    n->is_int = 1;
    if (p < end && *p == '.') {
        p++;
        n->frac_start = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        n->frac_len = (size_t)(p - n->frac_start);
        if (!n->frac_len) return BAIL;
        n->is_int = 0;
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        p++;
        if (p < end && (*p == '+' || *p == '-')) p++;
        const unsigned char *digits = p;
        while (p < end && *p >= '0' && *p <= '9') p++;
        if (p == digits) return BAIL;
        n->is_int = 0;
        n->has_exp = 1;
    }
    n->len = (size_t)(p - n->start);
    s->p = p;
    return OK;
}

/* An integer Number's value; -1 when it does not fit int64. */
static int number_int64(const Number *n, int64_t *out) {
    if (n->int_len > 19) return -1;
    uint64_t v = 0; /* 19 digits stay below 10^19 < 2^64: no step can overflow */
    for (size_t i = 0; i < n->int_len; i++) v = v * 10 + (uint64_t)(n->int_start[i] - '0');
    if (n->neg) {
        if (v > (uint64_t)INT64_MAX + 1) return -1;
        *out = (int64_t)(0 - v);
    } else {
        if (v > (uint64_t)INT64_MAX) return -1;
        *out = (int64_t)v;
    }
    return 0;
}

static int number_double(const Number *n, double *out) {
    char tmp[64];
    char *heap = NULL, *text = tmp;
    if (n->len >= sizeof tmp) {
        heap = malloc(n->len + 1);
        if (!heap) return NOMEM;
        text = heap;
    }
    memcpy(text, n->start, n->len);
    text[n->len] = 0;
    *out = strtod(text, NULL);
    free(heap);
    return OK;
}

static int skip_value(Scan *s);

static int skip_literal(Scan *s, const char *word, size_t len) {
    if ((size_t)(s->end - s->p) < len || memcmp(s->p, word, len) != 0) return BAIL;
    s->p += len;
    return OK;
}

/* An object member's key and its colon, at s->p; s->p is then at the value. */
static int read_key(Scan *s, const unsigned char **key, size_t *len, int *esc) {
    if (s->p >= s->end || *s->p != '"' || scan_string(s, key, len, esc)) return BAIL;
    ws(s);
    if (s->p >= s->end || *s->p != ':') return BAIL;
    s->p++;
    ws(s);
    return OK;
}

/* At a container's opening bracket: 1 when members follow (s->p at the first), 0 when it is empty (s->p past
 * `close`), -1 when it is nested too deep. */
static int open_container(Scan *s, unsigned char close) {
    if (++s->depth > MAX_DEPTH) return -1;
    s->p++;
    ws(s);
    if (s->p < s->end && *s->p == close) {
        s->p++;
        s->depth--;
        return 0;
    }
    return 1;
}

/* After a member or element: 1 when another follows (s->p at it), 0 when `close` ends the container (s->p
 * past it), -1 for anything else. */
static int next_member(Scan *s, unsigned char close) {
    ws(s);
    if (s->p >= s->end) return -1;
    if (*s->p == ',') {
        s->p++;
        ws(s);
        return 1;
    }
    if (*s->p == close) {
        s->p++;
        s->depth--;
        return 0;
    }
    return -1;
}

static int skip_container(Scan *s, unsigned char close) {
    int members = open_container(s, close);
    if (members <= 0) return members < 0 ? BAIL : OK;
    for (;;) {
        if (close == '}') {
            const unsigned char *ks;
            size_t kl;
            int esc;
            if (read_key(s, &ks, &kl, &esc)) return BAIL;
        }
        int r = skip_value(s);
        if (r) return r;
        int more = next_member(s, close);
        if (more <= 0) return more < 0 ? BAIL : OK;
    }
}

static int skip_value(Scan *s) {
    if (s->p >= s->end) return BAIL;
    switch (*s->p) {
    case '"': {
        const unsigned char *st;
        size_t l;
        int esc;
        return scan_string(s, &st, &l, &esc);
    }
    case '{': return skip_container(s, '}');
    case '[': return skip_container(s, ']');
    case 't': return skip_literal(s, "true", 4);
    case 'f': return skip_literal(s, "false", 5);
    case 'n': return skip_literal(s, "null", 4);
    default: {
        Number n;
        return scan_number(s, &n);
    }
    }
}

/* ------------------------------------------------------------------------------------------------ values */

/* A base field's text column (ph ... args), built as the span is read: an event has at most one value of each,
 * so the value's bytes (escapes decoded) go straight after the row before's, while they are in the cache.
 * Arrow's string view layout, which polars holds text in (so it takes the column as it is, where int64 offsets
 * cost it a copy of every value): a 16-byte view per row, the length then the bytes themselves up to 12 of
 * them, else the first 4 and the value's offset in the data; one validity byte per row. Nothing until the
 * field's first value (then the rows before it are null), so a field no event of the span has (flow ids)
 * costs nothing. */
typedef struct {
    Buf views, data, valid;
    int started;
    int64_t last_row;   /* the row of the latest value; -1 before the first */
    size_t value_start; /* where the latest value's bytes begin in data */
} Text;

typedef struct {
    Text text[N_TEXT];
    Buf ts, dur, ts_valid, dur_valid; /* dense: one int64 / one byte per row */
    Column *slots;
    int nslots;
    /* the args keys, bucketed by length for lookup */
    const char **key_text;
    size_t *key_len;
    int key_next[MAX_KEYS];
    int bucket[64];
    int64_t row;
} State;

static int text_entry(Column *c, Scan *s, int64_t row, const unsigned char *start, size_t len, int esc) {
    if (len > UINT32_MAX || (size_t)(start - s->base) > UINT32_MAX) return BAIL;
    Entry e = {.row = row, .esc = (uint8_t)esc};
    e.v.s.off = (uint32_t)(start - s->base);
    e.v.s.len = (uint32_t)len;
    return col_add(c, &e) ? NOMEM : OK;
}

static size_t decode_text(const unsigned char *p, size_t len, char *out, int flags);

/* Row `row`'s value of a base field (`esc`: how its bytes are copied, ESC_* or RAW_BAD). */
static int text_put(Text *t, int64_t row, const unsigned char *src, size_t len, int esc) {
    if (!t->started) { /* the field's first value: the rows before it are null */
        if (buf_grow(&t->views, (size_t)(row + 1) * 16) || buf_grow(&t->valid, (size_t)row + 1)) return NOMEM;
        memset(t->views.p, 0, (size_t)row * 16);
        t->views.len = (size_t)row * 16;
        memset(t->valid.p, 0, (size_t)row);
        t->valid.len = (size_t)row;
        t->started = 1;
    }
    if (buf_grow(&t->data, REPAIRED_MAX(len, esc))) return NOMEM;
    t->value_start = t->data.len;
    if (esc) {
        t->data.len += decode_text(src, len, t->data.p + t->data.len, esc);
    } else if (len) { /* (an empty value may meet data not yet allocated) */
        memcpy(t->data.p + t->data.len, src, len);
        t->data.len += len;
    }
    t->last_row = row;
    return OK;
}

/* Close row `row` of a base field (after its event is read): its view. A value of up to 12 bytes moves into
 * its view (its bytes leave the data); a longer one beyond 2 GiB of data (int32 offsets) is left to the
 * Python path. */
static int text_end_row(Text *t, int64_t row) {
    if (!t->started) return OK;
    if (buf_grow(&t->views, 16) || buf_grow(&t->valid, 1)) return NOMEM;
    unsigned char *view = (unsigned char *)t->views.p + t->views.len;
    memset(view, 0, 16);
    int present = t->last_row == row;
    if (present) {
        size_t len = t->data.len - t->value_start;
        const char *bytes = t->data.p + t->value_start;
        if (len > INT32_MAX || t->value_start > INT32_MAX) return BAIL;
        int32_t head[4] = {(int32_t)len, 0, 0, (int32_t)t->value_start}; /* length, prefix, buffer 0, offset */
        if (len <= 12) {
            memcpy(view, head, 4);
            if (len) memcpy(view + 4, bytes, len);
            t->data.len = t->value_start;
        } else {
            memcpy(&head[1], bytes, 4);
            memcpy(view, head, 16);
        }
    }
    t->views.len += 16;
    t->valid.p[t->valid.len++] = (char)present;
    return OK;
}

/* A text value (ph ... bp, str args) at s->p: a string (*esc says whether it has escapes), or an integer's
 * digits as written; *start is NULL for null. `bools`: true/false become their text (str args, as
 * json.dumps writes them). */
static int scan_text(Scan *s, int bools, const unsigned char **start, size_t *len, int *esc) {
    const unsigned char *p = s->p;
    *start = NULL;
    *esc = 0;
    if (p >= s->end) return BAIL;
    if (*p == '"') return scan_string(s, start, len, esc);
    if (*p == 'n') return skip_literal(s, "null", 4);
    if (bools && (*p == 't' || *p == 'f')) {
        int r = *p == 't' ? skip_literal(s, "true", 4) : skip_literal(s, "false", 5);
        *start = r ? NULL : p;
        *len = (size_t)(s->p - p);
        return r;
    }
    if (*p == '-' || (*p >= '0' && *p <= '9')) {
        Number n;
        int64_t v;
        if (scan_number(s, &n) || !n.is_int || number_int64(&n, &v)) return BAIL;
        if (n.neg && v == 0) return BAIL; /* -0: Python writes 0 */
        *start = n.start;
        *len = n.len;
        return OK;
    }
    return BAIL;
}

/* A str args slot's value; null is no entry. */
static int read_text(Scan *s, Column *c, int64_t row, int bools) {
    const unsigned char *start;
    size_t len;
    int esc;
    int r = scan_text(s, bools, &start, &len, &esc);
    return r || !start ? r : text_entry(c, s, row, start, len, esc);
}

/* A base field's value (ph ... bp); null leaves the row null. */
static int read_base_text(Scan *s, Text *t, int64_t row) {
    const unsigned char *start;
    size_t len;
    int esc;
    int r = scan_text(s, 0, &start, &len, &esc);
    return r || !start ? r : text_put(t, row, start, len, esc);
}

/* ts/dur: microseconds with at most 3 decimals -> exact ns. */
static int read_time(Scan *s, Buf *values, Buf *valid, int64_t row) {
    int64_t *vals = (int64_t *)values->p;
    if (s->p < s->end && *s->p == 'n') return skip_literal(s, "null", 4);
    Number n;
    if (scan_number(s, &n) || n.has_exp || n.frac_len > 3 || n.int_len > 16) return BAIL;
    int64_t whole = 0, frac = 0;
    for (size_t i = 0; i < n.int_len; i++) whole = whole * 10 + (n.int_start[i] - '0');
    if (whole > (INT64_MAX - 999) / 1000) return BAIL;
    for (size_t i = 0; i < 3; i++) frac = frac * 10 + (i < n.frac_len ? n.frac_start[i] - '0' : 0);
    int64_t ns = whole * 1000 + frac;
    vals[row] = n.neg ? -ns : ns;
    valid->p[row] = 1;
    return OK;
}

static int read_numeric_text(Scan *s, Column *c, int64_t row);

static int read_slot(Scan *s, State *st, int k, int64_t row) {
    Column *c = &st->slots[k];
    const unsigned char *p = s->p;
    if (p >= s->end) return BAIL;
    if (c->type == T_STR) return read_text(s, c, row, 1);
    if (c->type == T_JSON) {
        if (*p == '"') {
            const unsigned char *ss;
            size_t l;
            int esc;
            int r = scan_string(s, &ss, &l, &esc);
            return r ? r : text_entry(c, s, row, ss, l, esc);
        }
        if (*p == 'n') return skip_literal(s, "null", 4);
        int64_t bad_before = s->bad_strings;
        int r = skip_value(s);
        return r ? r : text_entry(c, s, row, p, (size_t)(s->p - p), s->bad_strings != bad_before ? RAW_BAD : 0);
    }
    /* int / float */
    if (*p == '"') return read_numeric_text(s, c, row);
    /* containers are decoded whole by the Python path (a number in them may be out of range) */
    if (*p == '{' || *p == '[') return BAIL;
    if (*p != '-' && !(*p >= '0' && *p <= '9')) return skip_value(s); /* null, bool: null */
    Number n;
    if (scan_number(s, &n)) return BAIL;
    Entry e = {.row = row};
    if (c->type == T_INT) {
        if (n.is_int) {
            /* beyond int64: null; beyond uint64's 20 digits, the Python path's (msgspec refuses 4,301 digits) */
            if (n.int_len > 20) return BAIL;
            if (number_int64(&n, &e.v.i)) return OK;
        } else {
            double d;
            if (number_double(&n, &d)) return NOMEM;
            if (!isfinite(d)) return BAIL; /* out of a double's range: msgspec refuses it */
            if (floor(d) != d || d < -9223372036854775808.0 || d >= 9223372036854775808.0) return OK;
            e.v.i = (int64_t)d;
        }
    } else {
        if (n.is_int) {
            int64_t v;
            if (number_int64(&n, &v)) return BAIL;
            e.v.f = (double)v;
        } else {
            if (number_double(&n, &e.v.f)) return NOMEM;
            if (!isfinite(e.v.f)) return BAIL;
        }
    }
    return col_add(c, &e) ? NOMEM : OK;
}

/* A number written as a string ("stream": "0x0", "bytes": "1": ROCm traces). Read here only in the plain
 * forms whose value Python's int(text.strip(), 0) / float(text) agree on: -?(0|[1-9][0-9]*|0[xX][0-9a-fA-F]+)
 * for int keys, -?[0-9]+(.[0-9]+)? for float keys, within int64; anything else (spaces, underscores, octal,
 * exponents, escapes, "inf") is left to the Python path. */
static int read_numeric_text(Scan *s, Column *c, int64_t row) {
    const unsigned char *st;
    size_t l;
    int esc;
    int r = scan_string(s, &st, &l, &esc);
    if (r) return r;
    if (esc || l == 0 || l > 40) return BAIL;
    const unsigned char *p = st, *end = st + l;
    int neg = *p == '-';
    p += neg;
    if (p >= end) return BAIL;
    Entry e = {.row = row};
    if (c->type == T_INT && end - p > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
        uint64_t v = 0;
        for (p += 2; p < end; p++) {
            int h = hexval(*p);
            if (h < 0 || v >> 59) return BAIL;
            v = v * 16 + (uint64_t)h;
        }
        if (v > (uint64_t)INT64_MAX + neg) return BAIL;
        e.v.i = neg ? (int64_t)(0 - v) : (int64_t)v;
        return col_add(c, &e) ? NOMEM : OK;
    }
    Scan inner = {.base = st, .p = st, .end = end};
    Number n;
    if (scan_number(&inner, &n) || inner.p != end || n.has_exp) return BAIL;
    if (c->type == T_INT) {
        if (!n.is_int || number_int64(&n, &e.v.i)) return BAIL;
    } else {
        if (number_double(&n, &e.v.f)) return NOMEM;
    }
    return col_add(c, &e) ? NOMEM : OK;
}

static int find_key(State *st, const unsigned char *k, size_t len) {
    /* (the first and last bytes before memcmp: keys of one length are many, and most keys are not ours) */
    for (int i = st->bucket[len & 63]; i >= 0; i = st->key_next[i])
        if (st->key_len[i] == len && (!len || ((unsigned char)st->key_text[i][0] == k[0] &&
                                               (unsigned char)st->key_text[i][len - 1] == k[len - 1])) &&
            memcmp(st->key_text[i], k, len) == 0)
            return i;
    return -1;
}

static int scan_args(Scan *s, State *st, int64_t row, unsigned char *seen) {
    int members = open_container(s, '}');
    if (members <= 0) return members < 0 ? BAIL : OK;
    for (;;) {
        const unsigned char *ks;
        size_t kl;
        int esc, r;
        if (read_key(s, &ks, &kl, &esc) || esc) return BAIL;
        int k = find_key(st, ks, kl);
        if (k >= 0) {
            if (seen[k]) return BAIL;
            seen[k] = 1;
            r = read_slot(s, st, k, row);
        } else {
            r = skip_value(s);
        }
        if (r) return r;
        int more = next_member(s, '}');
        if (more <= 0) return more < 0 ? BAIL : OK;
    }
}

static int field_of(const unsigned char *k, size_t len) {
    /* byte by byte: the compiler called memcmp for these */
#define IS2(a, b) (k[0] == (a) && k[1] == (b))
#define IS3(a, b, c) (IS2(a, b) && k[2] == (c))
    switch (len) {
    case 2:
        if (IS2('p', 'h')) return F_PH;
        if (IS2('i', 'd')) return F_ID;
        if (IS2('b', 'p')) return F_BP;
        if (IS2('t', 's')) return F_TS;
        return -1;
    case 3:
        if (IS3('c', 'a', 't')) return F_CAT;
        if (IS3('p', 'i', 'd')) return F_PID;
        if (IS3('t', 'i', 'd')) return F_TID;
        if (IS3('d', 'u', 'r')) return F_DUR;
        return -1;
    case 4:
        if (IS3('n', 'a', 'm') && k[3] == 'e') return F_NAME;
        if (IS3('a', 'r', 'g') && k[3] == 's') return F_ARGS;
        return -1;
    default: return -1;
    }
#undef IS2
#undef IS3
}

static int scan_event(Scan *s, State *st, unsigned char *seen) {
    int64_t row = st->row;
    int seen_field[N_FIELDS] = {0};
    memset(seen, 0, (size_t)st->nslots);
    if (buf_grow(&st->ts, 8) || buf_grow(&st->dur, 8) || buf_grow(&st->ts_valid, 1) || buf_grow(&st->dur_valid, 1))
        return NOMEM;
    memset(st->ts.p + st->ts.len, 0, 8);
    memset(st->dur.p + st->dur.len, 0, 8);
    st->ts.len += 8;
    st->dur.len += 8;
    st->ts_valid.p[st->ts_valid.len++] = 0;
    st->dur_valid.p[st->dur_valid.len++] = 0;
    if (s->p >= s->end || *s->p != '{') return BAIL; /* an entry that is not an object */
    int members = open_container(s, '}');
    if (members <= 0) return members < 0 ? BAIL : OK;
    for (;;) {
        const unsigned char *ks;
        size_t kl;
        int esc, r;
        if (read_key(s, &ks, &kl, &esc) || esc) return BAIL;
        int f = field_of(ks, kl);
        if (f >= 0) {
            if (seen_field[f]) return BAIL;
            seen_field[f] = 1;
        }
        if (f < 0) {
            r = skip_value(s);
        } else if (f == F_TS) {
            r = read_time(s, &st->ts, &st->ts_valid, row);
        } else if (f == F_DUR) {
            r = read_time(s, &st->dur, &st->dur_valid, row);
        } else if (f == F_ARGS) {
            const unsigned char *v = s->p;
            int64_t bad_before = s->bad_strings;
            if (v < s->end && *v == '{') {
                r = scan_args(s, st, row, seen);
            } else if (v < s->end && *v == 'n') {
                r = skip_literal(s, "null", 4);
                if (!r) goto next; /* null args: no text */
            } else {
                r = skip_value(s);
            }
            if (!r) r = text_put(&st->text[F_ARGS], row, v, (size_t)(s->p - v), s->bad_strings != bad_before ? RAW_BAD : 0);
        } else {
            r = read_base_text(s, &st->text[f], row);
        }
        if (r) return r;
    next:;
        int more = next_member(s, '}');
        if (more <= 0) return more < 0 ? BAIL : OK;
    }
}

/* The events of a JSON array; `bare`: the array's body only (events and commas, no brackets). An empty
 * array is left to the Python path (the caller bails on zero rows). */
static int scan_array(Scan *s, State *st, int bare) {
    unsigned char seen[MAX_KEYS];
    ws(s);
    if (!bare) {
        if (s->p >= s->end || *s->p != '[') return BAIL;
        s->p++;
        ws(s);
    }
    for (;;) {
        int r = scan_event(s, st, seen);
        for (int f = 0; !r && f < N_TEXT; f++) r = text_end_row(&st->text[f], st->row);
        if (r) return r;
        st->row++;
        ws(s);
        if (s->p >= s->end) return bare ? OK : BAIL;
        if (*s->p == ',') {
            s->p++;
            ws(s);
            continue;
        }
        if (bare || *s->p != ']') return BAIL;
        s->p++;
        ws(s);
        return s->p == s->end ? OK : BAIL;
    }
}

/* ------------------------------------------------------------------------------------------------ output */

static void put_utf8(char *out, size_t *n, unsigned cp) {
    if (cp < 0x80) {
        out[(*n)++] = (char)cp;
    } else if (cp < 0x800) {
        out[(*n)++] = (char)(0xC0 | (cp >> 6));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else if (cp < 0x10000) {
        out[(*n)++] = (char)(0xE0 | (cp >> 12));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    } else {
        out[(*n)++] = (char)(0xF0 | (cp >> 18));
        out[(*n)++] = (char)(0x80 | ((cp >> 12) & 0x3F));
        out[(*n)++] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[(*n)++] = (char)(0x80 | (cp & 0x3F));
    }
}

/* JSON string body (validated by scan_string) -> UTF-8 at out; returns the length (never longer). */
static size_t unescape(const unsigned char *p, size_t len, char *out) {
    size_t n = 0;
    const unsigned char *end = p + len;
    while (p < end) {
        if (*p != '\\') {
            out[n++] = (char)*p++;
            continue;
        }
        unsigned char e = p[1];
        p += 2;
        switch (e) {
        case 'b': out[n++] = '\b'; break;
        case 'f': out[n++] = '\f'; break;
        case 'n': out[n++] = '\n'; break;
        case 'r': out[n++] = '\r'; break;
        case 't': out[n++] = '\t'; break;
        case 'u': {
            unsigned u, lo;
            read_hex4(p, end, &u);
            p += 4;
            if (u >= 0xD800 && u <= 0xDBFF) {
                read_hex4(p + 2, end, &lo);
                p += 6;
                u = 0x10000 + ((u - 0xD800) << 10) + (lo - 0xDC00);
            }
            put_utf8(out, &n, u);
            break;
        }
        default: out[n++] = (char)e; /* " \ / */
        }
    }
    return n;
}

/* A string body or raw JSON text (`flags`: ESC_* or RAW_BAD, nonzero) -> UTF-8 at out, each maximal invalid
 * subpart of the input as U+FFFD (so never more than REPAIRED_MAX bytes); returns the length. */
static size_t decode_text(const unsigned char *p, size_t len, char *out, int flags) {
    if (flags == ESC_ESCAPES) return unescape(p, len, out);
    const unsigned char *end = p + len;
    size_t n = 0;
    while (p < end) {
        const unsigned char *run = p;
        while (p < end && *p < 0x80 && (*p != '\\' || flags == RAW_BAD)) p++;
        memcpy(out + n, run, (size_t)(p - run));
        n += (size_t)(p - run);
        if (p >= end) break;
        if (*p == '\\') { /* an escape of a string body: its whole length is known */
            size_t k = 2;
            if (p[1] == 'u') { /* (a high surrogate's pair follows it: scan_string checked) */
                unsigned u;
                read_hex4(p + 2, end, &u);
                k = u >= 0xD800 && u <= 0xDBFF ? 12 : 6;
            }
            n += unescape(p, k, out + n);
            p += k;
            continue;
        }
        int valid;
        size_t k = utf8_sequence(p, end, &valid);
        if (valid) {
            memcpy(out + n, p, k);
            n += k;
        } else {
            memcpy(out + n, "\xEF\xBF\xBD", 3);
            n += 3;
        }
        p += k;
    }
    return n;
}

typedef struct {
    Buf a, b, c; /* values or offsets; text data; validity */
    int64_t present;
} Dense;

/* Densify a column's entries over n rows (GIL released: plain memory only). */
static int densify(const Column *c, const unsigned char *base, int64_t n, Dense *d) {
    const Entry *e = (const Entry *)c->entries.p;
    size_t count = c->entries.len / sizeof(Entry);
    size_t nbits = (size_t)(n + 7) / 8;
    d->present = (int64_t)count;
    if (!count) return OK;
    if (buf_grow(&d->c, nbits)) return NOMEM;
    memset(d->c.p, 0, nbits);
    d->c.len = nbits;
    for (size_t i = 0; i < count; i++) d->c.p[e[i].row >> 3] |= (char)(1u << (e[i].row & 7));
    if (c->type == T_INT || c->type == T_FLOAT) {
        if (buf_grow(&d->a, (size_t)n * 8)) return NOMEM;
        memset(d->a.p, 0, (size_t)n * 8);
        d->a.len = (size_t)n * 8;
        for (size_t i = 0; i < count; i++) memcpy(d->a.p + e[i].row * 8, &e[i].v, 8);
        return OK;
    }
    size_t total = 0;
    for (size_t i = 0; i < count; i++) total += REPAIRED_MAX(e[i].v.s.len, e[i].esc);
    if (buf_grow(&d->a, (size_t)(n + 1) * 8) || buf_grow(&d->b, total ? total : 1)) return NOMEM;
    int64_t *offsets = (int64_t *)d->a.p;
    d->a.len = (size_t)(n + 1) * 8;
    int64_t row = 0, pos = 0;
    offsets[0] = 0;
    for (size_t i = 0; i < count; i++) {
        while (row < e[i].row) offsets[++row] = pos;
        const unsigned char *src = base + e[i].v.s.off;
        if (e[i].esc) {
            pos += (int64_t)decode_text(src, e[i].v.s.len, d->b.p + pos, e[i].esc);
        } else {
            memcpy(d->b.p + pos, src, e[i].v.s.len);
            pos += e[i].v.s.len;
        }
        offsets[++row] = pos;
    }
    while (row < n) offsets[++row] = pos;
    d->b.len = (size_t)pos;
    return OK;
}

static int dense_bits(Buf *bytes, int64_t n, Buf *bits) {
    size_t nbits = (size_t)(n + 7) / 8;
    if (buf_grow(bits, nbits ? nbits : 1)) return NOMEM;
    memset(bits->p, 0, nbits);
    bits->len = nbits;
    for (int64_t i = 0; i < n; i++)
        if (bytes->p[i]) bits->p[i >> 3] |= (char)(1u << (i & 7));
    return OK;
}

/* A buffer handed to Python without a copy: a read-only object exporting the memory it owns (pyarrow wraps
 * it with py_buffer and keeps it alive as long as the column). Copying into bytes instead cost a fifth of
 * the scan: every output byte written once more, into fresh pages. */
typedef struct {
    PyObject_HEAD char *p;
    Py_ssize_t len;
} Block;

static int block_getbuffer(PyObject *self, Py_buffer *view, int flags) {
    Block *b = (Block *)self;
    return PyBuffer_FillInfo(view, self, b->p ? b->p : (char *)"", b->len, 1, flags);
}

static void block_dealloc(PyObject *self) {
    free(((Block *)self)->p);
    Py_TYPE(self)->tp_free(self);
}

static PyBufferProcs block_buffer = {block_getbuffer, NULL};

static PyTypeObject BlockType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "stepscope.analyze._scan.Block",
    .tp_basicsize = sizeof(Block),
    .tp_dealloc = block_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_as_buffer = &block_buffer,
    .tp_doc = "Memory the scanner filled, exported read-only (a column's buffer).",
};

/* The buffer's memory, handed over to a Block (b is left empty). */
static PyObject *as_block(Buf *b) {
    Block *block = PyObject_New(Block, &BlockType);
    if (!block) return NULL;
    block->p = b->p;
    block->len = (Py_ssize_t)b->len;
    b->p = NULL;
    b->len = b->cap = 0;
    return (PyObject *)block;
}

static PyObject *dense_object(Dense *d, int type) {
    if (!d->present) Py_RETURN_NONE;
    if (type == T_INT || type == T_FLOAT) return Py_BuildValue("(NN)", as_block(&d->a), as_block(&d->c));
    return Py_BuildValue("(NNN)", as_block(&d->a), as_block(&d->b), as_block(&d->c));
}

/* A base field's column: (views, data, validity bits), or None when no event of the span has it. */
static PyObject *text_object(Text *t, Buf *bits) {
    if (!t->started) Py_RETURN_NONE;
    return Py_BuildValue("(NNN)", as_block(&t->views), as_block(&t->data), as_block(bits));
}

static void free_buf(Buf *b) {
    free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

static void free_dense(Dense *d) {
    free_buf(&d->a);
    free_buf(&d->b);
    free_buf(&d->c);
}

/* ------------------------------------------------------------------------------------- mapped-file guards */

static PyObject *FileShrank; /* _scan.FileShrank (an OSError): a guarded mapping's file was cut short mid-scan */

/* A mapped trace file (`_read.FileMap`) that another process truncates while it is read faults with SIGBUS where
 * a page beyond its new end is touched, which would kill the process with no word. guard(mapping, path) names
 * the mapping's address range: a SIGBUS inside it then ends a scan_events of it (on any thread) with FileShrank,
 * and anywhere else (Python code reading the mapping) writes one line naming the file and exits with status 2,
 * stepscope's code for bad input. A SIGBUS outside every guarded range is left to the handler there was before.
 * A scan cut short by the signal leaks the memory it had taken (its state may be half-written). */
#ifdef GUARDS
#define MAX_GUARDS 64
#define MAX_SCANS 256
#define GUARD_PATH 1024
typedef struct {
    volatile int used;
    uintptr_t lo, hi;
    size_t path_len;
    char path[GUARD_PATH];
} Guard;
typedef struct {
    volatile int used;
    pthread_t thread;
    uintptr_t lo, hi;
    sigjmp_buf jump;
} Scanning;
static Guard guards[MAX_GUARDS];
static Scanning scanning[MAX_SCANS];
static int handler_installed = 0;
static struct sigaction previous_bus;

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)context;
    uintptr_t at = (uintptr_t)info->si_addr;
    pthread_t me = pthread_self();
    for (int i = 0; i < MAX_SCANS; i++)
        if (__atomic_load_n(&scanning[i].used, __ATOMIC_ACQUIRE) == 1 && pthread_equal(scanning[i].thread, me) &&
            at >= scanning[i].lo && at < scanning[i].hi)
            siglongjmp(scanning[i].jump, 1);
    for (int i = 0; i < MAX_GUARDS; i++)
        if (__atomic_load_n(&guards[i].used, __ATOMIC_ACQUIRE) && at >= guards[i].lo && at < guards[i].hi) {
            static const char head[] = "stepscope: error: ";
            static const char tail[] = ": the file was cut short while it was being read (another process truncated "
                                       "or rewrote it)\n";
            ssize_t w = write(2, head, sizeof head - 1);
            w = write(2, guards[i].path, guards[i].path_len);
            w = write(2, tail, sizeof tail - 1);
            (void)w;
            _exit(2);
        }
    sigaction(SIGBUS, &previous_bus, NULL); /* not ours: the fault repeats on return, to the handler before */
}

static PyObject *guard(PyObject *self, PyObject *args) {
    PyObject *mapping;
    const char *path;
    Py_ssize_t path_len;
    if (!PyArg_ParseTuple(args, "Oy#", &mapping, &path, &path_len)) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(mapping, &view, PyBUF_SIMPLE) < 0) return NULL;
    uintptr_t lo = (uintptr_t)view.buf, hi = lo + (uintptr_t)view.len;
    PyBuffer_Release(&view); /* (the address stays: the caller unguards before the mapping is closed) */
    if (!handler_installed) {
        struct sigaction action;
        memset(&action, 0, sizeof action);
        action.sa_sigaction = on_sigbus;
        action.sa_flags = SA_SIGINFO;
        sigemptyset(&action.sa_mask);
        if (sigaction(SIGBUS, &action, &previous_bus) != 0) return PyErr_SetFromErrno(PyExc_OSError);
        handler_installed = 1;
    }
    for (int i = 0; i < MAX_GUARDS; i++) {
        if (guards[i].used) continue;
        size_t n = (size_t)path_len < GUARD_PATH ? (size_t)path_len : GUARD_PATH;
        memcpy(guards[i].path, path, n);
        guards[i].path_len = n;
        guards[i].lo = lo;
        guards[i].hi = hi;
        __atomic_store_n(&guards[i].used, 1, __ATOMIC_RELEASE);
        return PyLong_FromLong(i);
    }
    return PyLong_FromLong(-1); /* every slot taken: this mapping goes unguarded */
}

static PyObject *unguard(PyObject *self, PyObject *args) {
    int i;
    if (!PyArg_ParseTuple(args, "i", &i)) return NULL;
    if (i >= 0 && i < MAX_GUARDS) __atomic_store_n(&guards[i].used, 0, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

/* The scanning slot of this thread's scan of [lo, hi) where that lies in a guarded range; -1 otherwise. */
static int scan_slot(const void *lo, const void *hi) {
    uintptr_t a = (uintptr_t)lo, b = (uintptr_t)hi;
    int covered = 0;
    for (int i = 0; i < MAX_GUARDS && !covered; i++)
        covered = __atomic_load_n(&guards[i].used, __ATOMIC_ACQUIRE) && a >= guards[i].lo && b <= guards[i].hi;
    if (!covered) return -1;
    for (int i = 0; i < MAX_SCANS; i++) {
        int expected = 0;
        if (__atomic_compare_exchange_n(&scanning[i].used, &expected, 2, 0, __ATOMIC_ACQ_REL, __ATOMIC_RELAXED)) {
            scanning[i].thread = pthread_self();
            scanning[i].lo = a;
            scanning[i].hi = b;
            return i; /* (marked 2, claimed but not armed: the handler looks only at armed slots, 1) */
        }
    }
    return -1;
}
#endif

/* ------------------------------------------------------------------------------------------------ entry */

static PyObject *scan_events(PyObject *self, PyObject *args) {
    Py_buffer view;
    PyObject *keys;
    const char *types;
    Py_ssize_t ntypes, start = 0, stop = -1;
    if (!PyArg_ParseTuple(args, "y*O!y#|nn", &view, &PyTuple_Type, &keys, &types, &ntypes, &start, &stop))
        return NULL;
    Py_ssize_t nkeys = PyTuple_GET_SIZE(keys);
    int bare = stop >= 0;
    if (!bare) stop = view.len;
    if (nkeys != ntypes || nkeys > MAX_KEYS || start < 0 || start > stop || stop > view.len) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "keys and types differ in length, too many keys, or a bad range");
        return NULL;
    }
    State st;
    memset(&st, 0, sizeof st);
    Column slots[MAX_KEYS];
    memset(slots, 0, sizeof slots);
    const char *key_text[MAX_KEYS];
    size_t key_len[MAX_KEYS];
    st.slots = slots;
    st.nslots = (int)nkeys;
    st.key_text = key_text;
    st.key_len = key_len;
    for (int i = 0; i < 64; i++) st.bucket[i] = -1;
    for (Py_ssize_t i = 0; i < nkeys; i++) {
        PyObject *k = PyTuple_GET_ITEM(keys, i);
        if (!PyBytes_Check(k)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_TypeError, "keys must be bytes");
            return NULL;
        }
        if ((unsigned char)types[i] > T_JSON) {
            PyBuffer_Release(&view);
            PyErr_Format(PyExc_ValueError, "types[%zd] is %d: a type code must be 0 (int) to 3 (json)", i,
                         (int)(unsigned char)types[i]);
            return NULL;
        }
        key_text[i] = PyBytes_AS_STRING(k);
        key_len[i] = (size_t)PyBytes_GET_SIZE(k);
        slots[i].type = types[i];
    }
    for (Py_ssize_t i = nkeys - 1; i >= 0; i--) { /* earlier keys first in a bucket */
        st.key_next[i] = st.bucket[key_len[i] & 63];
        st.bucket[key_len[i] & 63] = (int)i;
    }
    for (int f = 0; f < N_TEXT; f++) st.text[f].last_row = -1;

    Buf text_bits[N_TEXT];
    Dense dslots[MAX_KEYS];
    Buf ts_bits = {0}, dur_bits = {0};
    memset(text_bits, 0, sizeof text_bits);
    memset(dslots, 0, sizeof dslots);
    int status;
    int64_t n = 0, bad_strings = 0, first_bad = -1;
    /* numbers are read with strtod: only where the decimal point is '.' */
    int c_locale = localeconv()->decimal_point[0] == '.' && localeconv()->decimal_point[1] == 0;
    volatile int cut_short = 0;
    Py_BEGIN_ALLOW_THREADS
#ifdef GUARDS
    /* a guarded mapping (see guard): a SIGBUS while this thread reads it comes back here */
    int slot = scan_slot((const char *)view.buf + start, (const char *)view.buf + stop);
    if (slot >= 0 && sigsetjmp(scanning[slot].jump, 1) != 0) {
        cut_short = 1;
    } else {
        if (slot >= 0) __atomic_store_n(&scanning[slot].used, 1, __ATOMIC_RELEASE);
#endif
        Scan s = {.base = (const unsigned char *)view.buf + start, .p = (const unsigned char *)view.buf + start,
                  .end = (const unsigned char *)view.buf + stop};
        status = !c_locale ? BAIL : (size_t)(stop - start) > UINT32_MAX ? BAIL : scan_array(&s, &st, bare);
        n = st.row;
        bad_strings = s.bad_strings;
        if (s.first_bad) first_bad = (int64_t)(s.first_bad - s.base);
        if (status == OK && n == 0) status = BAIL;
        for (int f = 0; status == OK && f < N_TEXT; f++)
            if (st.text[f].started) status = dense_bits(&st.text[f].valid, n, &text_bits[f]);
        for (int k = 0; status == OK && k < st.nslots; k++) status = densify(&slots[k], s.base, n, &dslots[k]);
        if (status == OK) status = dense_bits(&st.ts_valid, n, &ts_bits);
        if (status == OK) status = dense_bits(&st.dur_valid, n, &dur_bits);
#ifdef GUARDS
    }
    if (slot >= 0) __atomic_store_n(&scanning[slot].used, 0, __ATOMIC_RELEASE);
#endif
    Py_END_ALLOW_THREADS
    if (cut_short) { /* (the scan's buffers are left as they are: its state may be half-written) */
        PyBuffer_Release(&view);
        PyErr_SetString(FileShrank, "the file was cut short while it was being read (another process truncated or "
                                    "rewrote it)");
        return NULL;
    }

    PyObject *result = NULL;
    if (status == NOMEM) {
        PyErr_NoMemory();
    } else if (status == BAIL) {
        result = Py_NewRef(Py_None);
    } else {
        PyObject *slot_tuple = PyTuple_New(st.nslots);
        if (slot_tuple) {
            for (int k = 0; k < st.nslots; k++) {
                PyObject *o = dense_object(&dslots[k], slots[k].type);
                if (!o) {
                    Py_CLEAR(slot_tuple);
                    break;
                }
                PyTuple_SET_ITEM(slot_tuple, k, o);
            }
        }
        if (slot_tuple) {
            result = Py_BuildValue("(LNNNNNNNN(NN)(NN)NLL)", (long long)n, text_object(&st.text[F_PH], &text_bits[F_PH]),
                                   text_object(&st.text[F_CAT], &text_bits[F_CAT]),
                                   text_object(&st.text[F_NAME], &text_bits[F_NAME]),
                                   text_object(&st.text[F_PID], &text_bits[F_PID]),
                                   text_object(&st.text[F_TID], &text_bits[F_TID]),
                                   text_object(&st.text[F_ID], &text_bits[F_ID]),
                                   text_object(&st.text[F_BP], &text_bits[F_BP]),
                                   text_object(&st.text[F_ARGS], &text_bits[F_ARGS]), as_block(&st.ts), as_block(&ts_bits),
                                   as_block(&st.dur), as_block(&dur_bits), slot_tuple, (long long)bad_strings,
                                   (long long)first_bad);
        }
    }
    for (int f = 0; f < N_TEXT; f++) {
        free_buf(&st.text[f].views);
        free_buf(&st.text[f].data);
        free_buf(&st.text[f].valid);
        free_buf(&text_bits[f]);
    }
    for (int k = 0; k < st.nslots; k++) {
        free_buf(&slots[k].entries);
        free_dense(&dslots[k]);
    }
    free_buf(&st.ts);
    free_buf(&st.dur);
    free_buf(&st.ts_valid);
    free_buf(&st.dur_valid);
    free_buf(&ts_bits);
    free_buf(&dur_bits);
    PyBuffer_Release(&view);
    return result;
}

/* nest(start, end, new_thread, parent, depth): the parent row (-1: none) and depth of each event of a frame in
 * nesting order (by thread, start, longest first), as nesting.parent_index's Python loop finds them: an event is the
 * child of the innermost open event of its thread that holds it whole. start, end: int64; new_thread: uint8 (1 where
 * a thread begins); parent, depth: writable int64 of the same length (the results). */
static PyObject *nest(PyObject *self, PyObject *args) {
    Py_buffer sb, eb, nb, pb, db;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*", &sb, &eb, &nb, &pb, &db)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = sb.len / (Py_ssize_t)sizeof(int64_t);
    if (eb.len != sb.len || nb.len != n || pb.len != sb.len || db.len != sb.len) {
        PyErr_SetString(PyExc_ValueError, "nest: start, end, new_thread, parent and depth must have one length");
        goto done;
    }
    const int64_t *start = (const int64_t *)sb.buf, *end = (const int64_t *)eb.buf;
    const uint8_t *new_thread = (const uint8_t *)nb.buf;
    int64_t *parent = (int64_t *)pb.buf, *depth = (int64_t *)db.buf;
    Py_ssize_t *stack = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(Py_ssize_t));
    if (stack == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t top = 0; /* entries on the stack */
    for (Py_ssize_t i = 0; i < n; i++) {
        if (new_thread[i]) top = 0;
        parent[i] = -1;
        while (top > 0) {
            int64_t top_end = end[stack[top - 1]];
            if (start[i] >= top_end || end[i] > top_end) {
                top--; /* torch: this cannot be a parent */
            } else {
                parent[i] = (int64_t)stack[top - 1];
                break;
            }
        }
        depth[i] = (int64_t)top;
        stack[top++] = i;
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(stack);
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&sb);
    PyBuffer_Release(&eb);
    PyBuffer_Release(&nb);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&db);
    return result;
}

/* collapse(parent, names, lifted, out_parent, removed, out_lifted, depth): torch's `_remove_dup_nodes` as
 * nesting.collapse_repeated's Python loop does it, over rows in nesting order: a child with its (surviving) parent's
 * name, where that parent has no other child, is removed; its children become the parent's and its `lifted` value
 * replaces the parent's. parent, names, lifted: int64 inputs (parent -1: none; each parent before its children);
 * out_parent, out_lifted, depth: writable int64, removed: writable uint8, all of one length (the results). */
static PyObject *collapse(PyObject *self, PyObject *args) {
    Py_buffer pb, nb, lb, opb, rb, olb, db;
    if (!PyArg_ParseTuple(args, "y*y*y*w*w*w*w*", &pb, &nb, &lb, &opb, &rb, &olb, &db)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = pb.len / (Py_ssize_t)sizeof(int64_t);
    if (nb.len != pb.len || lb.len != pb.len || opb.len != pb.len || rb.len != n || olb.len != pb.len ||
        db.len != pb.len) {
        PyErr_SetString(PyExc_ValueError, "collapse: every array must have one length");
        goto done;
    }
    const int64_t *parent = (const int64_t *)pb.buf, *names = (const int64_t *)nb.buf;
    int64_t *par = (int64_t *)opb.buf, *lift = (int64_t *)olb.buf, *depth = (int64_t *)db.buf;
    uint8_t *removed = (uint8_t *)rb.buf;
    int64_t *nchild = PyMem_Calloc((size_t)(n > 0 ? n : 1), sizeof(int64_t));
    int64_t *eff = PyMem_Malloc((size_t)(n > 0 ? n : 1) * sizeof(int64_t));
    if (nchild == NULL || eff == NULL) {
        PyMem_Free(nchild);
        PyMem_Free(eff);
        PyErr_NoMemory();
        goto done;
    }
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    memcpy(lift, lb.buf, (size_t)n * sizeof(int64_t));
    for (Py_ssize_t i = 0; i < n; i++) {
        int64_t p = parent[i];
        if (p >= n || (p >= 0 && p >= i)) { bad = 1; break; } /* not in nesting order */
        if (p >= 0) nchild[p]++;
    }
    for (Py_ssize_t i = 0; i < n && !bad; i++) {
        int64_t p = parent[i];
        eff[i] = i;
        removed[i] = 0;
        depth[i] = 0;
        par[i] = p;
        if (p < 0) continue;
        p = eff[p];
        par[i] = p;
        depth[i] = depth[p] + 1;
        if (names[p] == names[i] && nchild[p] == 1) {
            removed[i] = 1;
            eff[i] = p;
            nchild[p] = nchild[i];
            lift[p] = lift[i];
        }
    }
    Py_END_ALLOW_THREADS
    PyMem_Free(nchild);
    PyMem_Free(eff);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "collapse: a parent row must come before its children");
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&pb);
    PyBuffer_Release(&nb);
    PyBuffer_Release(&lb);
    PyBuffer_Release(&opb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&olb);
    PyBuffer_Release(&db);
    return result;
}

/* replay(order, ptr, src, weight, row, t, via): depgraph.replay's walk. Nodes in topological `order`; node v's in-edges
 * are positions ptr[v] .. ptr[v+1]-1 (sorted by priority), edge position e from node src[e] with weight[e], row[e]
 * its row in the graph's edges. A node with in-edges takes the largest t[src] + weight (the first of equals) and
 * remembers that edge's row in via; one without keeps t. t, via: writable int64 (node times in, replayed out; via
 * -1 in). An int64 overflow raises OverflowError (the caller replays in Python, exactly). */
static PyObject *replay(PyObject *self, PyObject *args) {
    Py_buffer ob, pb, sb, wb, rb, tb, vb;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*w*", &ob, &pb, &sb, &wb, &rb, &tb, &vb)) return NULL;
    PyObject *result = NULL;
    Py_ssize_t n = tb.len / (Py_ssize_t)sizeof(int64_t), m = sb.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n_order = ob.len / (Py_ssize_t)sizeof(int64_t);
    if (vb.len != tb.len || pb.len != (n + 1) * (Py_ssize_t)sizeof(int64_t) || wb.len != sb.len || rb.len != sb.len) {
        PyErr_SetString(PyExc_ValueError, "replay: ptr must have one more entry than t and via; src, weight, row one length");
        goto done;
    }
    const int64_t *order = (const int64_t *)ob.buf, *ptr = (const int64_t *)pb.buf, *src = (const int64_t *)sb.buf;
    const int64_t *weight = (const int64_t *)wb.buf, *row = (const int64_t *)rb.buf;
    int64_t *t = (int64_t *)tb.buf, *via = (int64_t *)vb.buf;
    int bad = 0; /* 1: an index out of range, 2: an overflow */
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n_order && !bad; i++) {
        int64_t v = order[i];
        if (v < 0 || v >= n) { bad = 1; break; }
        int64_t a = ptr[v], b = ptr[v + 1];
        if (a >= b) continue;
        if (a < 0 || b > m) { bad = 1; break; }
        int64_t best = 0, chosen = a;
        for (int64_t e = a; e < b; e++) {
            int64_t u = src[e], c;
            if (u < 0 || u >= n) { bad = 1; break; }
            if (__builtin_add_overflow(t[u], weight[e], &c)) { bad = 2; break; }
            if (e == a || c > best) { best = c; chosen = e; }
        }
        if (bad) break;
        t[v] = best;
        via[v] = row[chosen];
    }
    Py_END_ALLOW_THREADS
    if (bad == 1) {
        PyErr_SetString(PyExc_IndexError, "replay: a node or edge index out of range");
        goto done;
    }
    if (bad == 2) {
        PyErr_SetString(PyExc_OverflowError, "replay: a node time does not fit in int64");
        goto done;
    }
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&ob);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&wb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&vb);
    return result;
}

/* walk(via, src, t, starts, ends, counts, heads[, rows]): critical_path.path_segments' walk back from each window's
 * end node ends[w]: while t[v] > starts[w] and via[v] >= 0 (the row of the edge that set v), that edge is on the path
 * and v becomes its source src[e]. Without rows: counts[w] = the path's edges, plus one for an unexplained head (the
 * walk stopped at a node v still after the start: heads[w] = v, else -1). With rows (sum(counts) int64): each
 * window's path in time order, its head first as -1. via: int64 per node (-1: none), src: int64 per edge row, t:
 * int64 per node; counts, heads: writable int64 per window. A walk longer than the node count (a cycle in via) or
 * an index out of range raises ValueError / IndexError before any row is written past its window. */
static PyObject *walk(PyObject *self, PyObject *args) {
    Py_buffer vb, sb, tb, stb, eb, cb, hb, rb;
    rb.buf = NULL;
    if (!PyArg_ParseTuple(args, "y*y*y*y*y*w*w*|w*", &vb, &sb, &tb, &stb, &eb, &cb, &hb, &rb)) return NULL;
    PyObject *result = NULL;
    int fill = rb.buf != NULL;
    Py_ssize_t n = tb.len / (Py_ssize_t)sizeof(int64_t), m = sb.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t k = stb.len / (Py_ssize_t)sizeof(int64_t);
    Py_ssize_t n_rows = fill ? rb.len / (Py_ssize_t)sizeof(int64_t) : 0;
    if (vb.len != tb.len || eb.len != stb.len || cb.len != stb.len || hb.len != stb.len) {
        PyErr_SetString(PyExc_ValueError, "walk: via and t one length per node; starts, ends, counts, heads one per window");
        goto done;
    }
    const int64_t *via = (const int64_t *)vb.buf, *src = (const int64_t *)sb.buf, *t = (const int64_t *)tb.buf;
    const int64_t *starts = (const int64_t *)stb.buf, *ends = (const int64_t *)eb.buf;
    int64_t *counts = (int64_t *)cb.buf, *heads = (int64_t *)hb.buf, *rows = fill ? (int64_t *)rb.buf : NULL;
    int bad = 0; /* 1: an index out of range, 2: a cycle, 3: rows of the wrong size */
    Py_ssize_t pos = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t w = 0; w < k && !bad; w++) {
        int64_t v = ends[w], start = starts[w], len = 0;
        if (v < 0 || v >= n) { bad = 1; break; }
        if (fill) { /* the counting call's answer: this window's rows end at pos + counts[w] */
            if (counts[w] < 0 || counts[w] > n_rows - pos) { bad = 3; break; }
            len = counts[w];
            int64_t at = pos + len; /* filled back to front: the walk runs from the end */
            while (t[v] > start && via[v] >= 0) {
                int64_t e = via[v];
                if (e >= m || at <= pos) { bad = e >= m ? 1 : 3; break; }
                rows[--at] = e;
                v = src[e];
                if (v < 0 || v >= n) { bad = 1; break; }
            }
            if (bad) break;
            if (t[v] > start) {
                if (at != pos + 1) { bad = 3; break; }
                rows[--at] = -1;
            }
            if (at != pos) { bad = 3; break; }
            pos += len;
        } else {
            while (t[v] > start && via[v] >= 0) {
                int64_t e = via[v];
                if (e >= m) { bad = 1; break; }
                if (++len > n) { bad = 2; break; }
                v = src[e];
                if (v < 0 || v >= n) { bad = 1; break; }
            }
            if (bad) break;
            heads[w] = t[v] > start ? v : -1;
            counts[w] = len + (t[v] > start);
        }
    }
    if (fill && !bad && pos != n_rows) bad = 3;
    Py_END_ALLOW_THREADS
    if (bad == 1) PyErr_SetString(PyExc_IndexError, "walk: a node or edge index out of range");
    else if (bad == 2) PyErr_SetString(PyExc_ValueError, "walk: the edges that set the nodes' times form a cycle");
    else if (bad == 3) PyErr_SetString(PyExc_ValueError, "walk: rows do not match the counts of the counting call");
    if (bad) goto done;
    result = Py_None;
    Py_INCREF(result);
done:
    PyBuffer_Release(&vb);
    PyBuffer_Release(&sb);
    PyBuffer_Release(&tb);
    PyBuffer_Release(&stb);
    PyBuffer_Release(&eb);
    PyBuffer_Release(&cb);
    PyBuffer_Release(&hb);
    if (fill) PyBuffer_Release(&rb);
    return result;
}

static PyMethodDef methods[] = {
    {"scan_events", scan_events, METH_VARARGS,
     "scan_events(document, keys, types[, start, end]) -> column buffers, or None where the Python path must read "
     "the span. With start and end: the bytes document[start:end] are an array's body (events and commas)."},
    {"nest", nest, METH_VARARGS,
     "nest(start, end, new_thread, parent, depth): each event's parent row and depth (nesting.parent_index)."},
    {"collapse", collapse, METH_VARARGS,
     "collapse(parent, names, lifted, out_parent, removed, out_lifted, depth): torch's _remove_dup_nodes "
     "(nesting.collapse_repeated)."},
    {"replay", replay, METH_VARARGS,
     "replay(order, ptr, src, weight, row, t, via): depgraph.replay's longest-path walk, in place on t and via."},
    {"walk", walk, METH_VARARGS,
     "walk(via, src, t, starts, ends, counts, heads[, rows]): critical_path.path_segments' walk back from each "
     "window's end: counts and heads, then (given rows) each path's edge rows in time order."},
#ifdef GUARDS
    {"guard", guard, METH_VARARGS,
     "guard(mapping, path) -> handle: a SIGBUS in the mapping (its file cut short) ends a scan of it with FileShrank, "
     "or elsewhere the process with one line naming `path` and status 2. -1: not guarded (every slot taken)."},
    {"unguard", unguard, METH_VARARGS, "unguard(handle): the mapping is no longer guarded (before it is closed)."},
#endif
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_scan", "The compiled fast path of ingest (see _scan.c).",
                                    -1, methods};

PyMODINIT_FUNC PyInit__scan(void) {
    if (PyType_Ready(&BlockType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    FileShrank = PyErr_NewException("stepscope.analyze._scan.FileShrank", PyExc_OSError, NULL);
    if (!FileShrank || PyModule_AddObjectRef(m, "FileShrank", FileShrank) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
