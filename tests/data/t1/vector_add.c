void vector_add(float *c, const float *a, const float *b, int n) {
    for (int start = 0; start < n; start += block_size_x) {
        int end = start + block_size_x < n ? start + block_size_x : n;
        int i = start;
        for (; i + unroll <= end; i += unroll)
            for (int j = 0; j < unroll; j++) c[i + j] = a[i + j] + b[i + j];
        for (; i < end; i++) c[i] = a[i] + b[i];
    }
}
