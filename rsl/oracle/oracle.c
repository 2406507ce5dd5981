/*
 * oracle.c -- differential-testing oracle over the real Globus RSL library.
 *
 * Part of the `rsl` crate's test suite (never linked into the product).
 * For every input it prints what libglobus-rsl makes of it:
 *
 *   PARSE OK | PARSE ERROR
 *   UNPARSE <n>\n<n bytes>\n      or  UNPARSE NULL      globus_rsl_unparse()
 *   CANON <n>\n<n bytes>\n        or  CANON NULL        after globus_rsl_assist_attributes_canonicalize()
 *   EVAL <n>\n<n bytes>\n         or  EVAL ERROR rc=N   globus_rsl_eval() with an EMPTY symbol table
 *                                  or  EVAL NULL         (eval succeeded, unparse failed)
 *   END
 *
 * Usage:
 *   oracle FILE        one input, read verbatim from FILE ("-" = stdin)
 *   oracle --batch     many inputs on stdin, each framed as "<n>\n<n bytes>"
 *
 * The input is handed to globus_rsl_parse() as a C string, so it ends at the
 * first NUL byte, exactly as it would for any C caller.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "globus_common.h"
#include "globus_rsl.h"
#include "globus_rsl_assist.h"

static void emit(const char *tag, char *text)
{
    if (text == NULL) {
        printf("%s NULL\n", tag);
        return;
    }
    size_t n = strlen(text);
    printf("%s %zu\n", tag, n);
    fwrite(text, 1, n, stdout);
    putchar('\n');
    free(text);
}

static void run_one(char *input)
{
    globus_rsl_t *rsl = globus_rsl_parse(input);
    if (rsl == NULL) {
        printf("PARSE ERROR\nEND\n");
        return;
    }
    printf("PARSE OK\n");
    emit("UNPARSE", globus_rsl_unparse(rsl));
    globus_rsl_free_recursive(rsl);

    rsl = globus_rsl_parse(input);
    if (rsl != NULL && globus_rsl_assist_attributes_canonicalize(rsl) == GLOBUS_SUCCESS) {
        emit("CANON", globus_rsl_unparse(rsl));
    } else {
        printf("CANON NULL\n");
    }
    if (rsl != NULL) {
        globus_rsl_free_recursive(rsl);
    }

    rsl = globus_rsl_parse(input);
    if (rsl != NULL) {
        globus_symboltable_t table;
        globus_symboltable_init(&table, globus_hashtable_string_hash,
                                globus_hashtable_string_keyeq);
#ifdef ORACLE_OUTER_SCOPE
        globus_symboltable_create_scope(&table);
#endif
        int rc = globus_rsl_eval(rsl, &table);
        if (rc != 0) {
            printf("EVAL ERROR rc=%d\n", rc);
        } else {
            emit("EVAL", globus_rsl_unparse(rsl));
        }
        /* eval leaves scopes behind on error; the table is leaked on purpose */
        globus_rsl_free_recursive(rsl);
    }
    printf("END\n");
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap + 1);
    if (buf == NULL) {
        return NULL;
    }
    size_t got;
    while ((got = fread(buf + n, 1, cap - n, f)) > 0) {
        n += got;
        if (n == cap) {
            cap *= 2;
            char *bigger = realloc(buf, cap + 1);
            if (bigger == NULL) {
                free(buf);
                return NULL;
            }
            buf = bigger;
        }
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int run_batch(void)
{
    size_t len;
    while (scanf("%zu", &len) == 1) {
        if (getchar() != '\n') {
            fprintf(stderr, "oracle: bad frame header\n");
            return 2;
        }
        char *buf = malloc(len + 1);
        if (buf == NULL || fread(buf, 1, len, stdin) != len) {
            fprintf(stderr, "oracle: short frame\n");
            return 2;
        }
        buf[len] = '\0';
        run_one(buf);
        free(buf);
        fflush(stdout);
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 2) {
        fprintf(stderr, "usage: oracle FILE | oracle --batch\n");
        return 2;
    }
    if (globus_module_activate(GLOBUS_RSL_MODULE) != GLOBUS_SUCCESS) {
        fprintf(stderr, "oracle: cannot activate globus_rsl\n");
        return 2;
    }
    int rc = 0;
    if (strcmp(argv[1], "--batch") == 0) {
        rc = run_batch();
    } else {
        FILE *f = strcmp(argv[1], "-") == 0 ? stdin : fopen(argv[1], "rb");
        size_t len;
        char *input = f ? read_all(f, &len) : NULL;
        if (input == NULL) {
            perror(argv[1]);
            return 2;
        }
        run_one(input);
        free(input);
    }
    fflush(stdout);
    globus_module_deactivate(GLOBUS_RSL_MODULE);
    return rc;
}
