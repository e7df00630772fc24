__constant__ float scale[4];
extern "C" __global__ void vector_add(float *c, const float *a, const float *b, const float *s, int n) {
    int i = (blockIdx.x * block_size_x + threadIdx.x) * tile_size_x;
    for (int j = 0; j < tile_size_x; j++)
        if (i + j < n) c[i + j] = scale[0] * a[i + j] + b[i + j];
}
