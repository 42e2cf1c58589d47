/* A stand-in for the NVIDIA driver (libcuda.so.1) on machines with no GPU, for the tests of the thin runtime's
   driver checks (mlc.runtime.runner.CudaDriver) and of TVM's CUDA runtime reading an artifact's GPU code. It
   answers the queries from FAKE_CUDA="driver_version,gpu_count,major.minor" (e.g. "13000,1,9.0"); it loads no
   module and launches nothing (CUDA_ERROR_NOT_SUPPORTED = 801). Its events (the profile's device timing) read a
   clock that each record on the default stream moves on by 0.25 ms; another stream is refused. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int version = 13000, count = 1, major = 9, minor = 0;

static void configure(void) {
  const char *spec = getenv("FAKE_CUDA");
  if (spec) sscanf(spec, "%d,%d,%d.%d", &version, &count, &major, &minor);
}

int cuInit(unsigned flags) { (void)flags; configure(); return 0; }
int cuDriverGetVersion(int *v) { configure(); *v = version; return 0; }
int cuDeviceGetCount(int *n) { *n = count; return 0; }
int cuDeviceGet(int *device, int ordinal) { if (ordinal >= count) return 101; *device = ordinal; return 0; }
int cuDeviceGetAttribute(int *value, int attribute, int device) {
  (void)device;
  if (attribute == 75) { *value = major; return 0; }
  if (attribute == 76) { *value = minor; return 0; }
  return 801;
}
int cuDeviceGetName(char *name, int length, int device) {
  snprintf(name, (size_t)length, "Fake GPU %d (sm_%d%d)", device, major, minor);
  return 0;
}
int cuGetErrorName(int error, const char **s) { (void)error; *s = "CUDA_ERROR_NOT_SUPPORTED"; return 0; }
int cuGetErrorString(int error, const char **s) { (void)error; *s = "fake driver"; return 0; }
int cuModuleLoadData(void **module, const void *image) { (void)module; (void)image; return 801; }
int cuModuleUnload(void *module) { (void)module; return 0; }
int cuModuleGetFunction(void **f, void *m, const char *name) { (void)f; (void)m; (void)name; return 801; }
int cuFuncSetAttribute(void *f, int a, int v) { (void)f; (void)a; (void)v; return 801; }
int cuLaunchKernelEx(const void *config, void *f, void **params, void **extra) {
  (void)config; (void)f; (void)params; (void)extra; return 801;
}
int cuTensorMapEncodeTiled(void) { return 801; }

typedef struct { float at; } fake_event;
static float clock_ms = 0.0f;
int cuEventCreate(void **event, unsigned flags) {
  fake_event *made = malloc(sizeof *made);
  (void)flags; made->at = -1.0f; *event = made; return 0;
}
int cuEventRecord(void *event, void *stream) {
  if (stream) return 400; /* CUDA_ERROR_INVALID_HANDLE: TVM launches on the default stream only */
  clock_ms += 0.25f; ((fake_event *)event)->at = clock_ms; return 0;
}
int cuEventSynchronize(void *event) { return ((fake_event *)event)->at < 0 ? 600 : 0; }
int cuEventElapsedTime_v2(float *ms, void *start, void *end) {
  float from = ((fake_event *)start)->at, to = ((fake_event *)end)->at;
  if (from < 0 || to < 0) return 600; /* CUDA_ERROR_NOT_READY: never recorded */
  *ms = to - from; return 0;
}
int cuEventDestroy_v2(void *event) { free(event); return 0; }
