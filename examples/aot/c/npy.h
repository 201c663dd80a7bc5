/* Reading the .npy files the examples write (version 1, the data after the header). */
#ifndef SMELT_EXAMPLES_NPY_H
#define SMELT_EXAMPLES_NPY_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The data of a version-1 .npy file of exactly `want` bytes (malloc'ed), or NULL. */
static void *read_npy(const char *path, size_t want) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    unsigned char head[10];
    void *data = NULL;
    if (fread(head, 1, 10, f) == 10 && memcmp(head, "\x93NUMPY", 6) == 0 && head[6] == 1) {
        size_t header = head[8] | (size_t)head[9] << 8;
        data = malloc(want);
        if (fseek(f, (long)(10 + header), SEEK_SET) != 0 || fread(data, 1, want, f) != want ||
            fgetc(f) != EOF) {
            free(data);
            data = NULL;
        }
    }
    fclose(f);
    return data;
}

#endif
