/* A compiled module that AstrAI's loader of kernel modules finds in astrai/extension/lib/ under
 * one kernel's name (attn_decode, attn_prefill, ..., fp8_mm). AstrAI's loader looks for compiled modules
 * (its newer versions list the .so files there), so the stand-in is one; it fills itself from
 * astrai_jit.astrai_csrc, which holds the function with AstrAI's signature. One library exports
 * every name's init function; astrai_jit.astrai_install copies it once per name. */
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject* make_kernel_module(PyModuleDef* def) {
  PyObject* module = PyModule_Create(def);
  if (module == NULL) return NULL;
  PyObject* impl = PyImport_ImportModule("astrai_jit.astrai_csrc");
  PyObject* done = impl == NULL ? NULL : PyObject_CallMethod(impl, "populate", "O", module);
  Py_XDECREF(impl);
  if (done == NULL) {
    Py_DECREF(module);
    /* AstrAI's loader marks a kernel unavailable on ImportError only: anything else would stop
     * `import astrai` instead of falling back to its torch path. */
    if (!PyErr_ExceptionMatches(PyExc_ImportError)) {
      PyObject *type, *value, *trace;
      PyErr_Fetch(&type, &value, &trace);
      PyErr_NormalizeException(&type, &value, &trace);
      PyErr_Format(PyExc_ImportError, "astrai-jit could not serve %s: %S", def->m_name,
                   value != NULL ? value : Py_None);
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(trace);
    }
    return NULL;
  }
  Py_DECREF(done);
  return module;
}

#define ASTRAI_KERNEL_MODULE(name)                                                  \
  static PyModuleDef name##_def = {PyModuleDef_HEAD_INIT, #name, NULL, -1, NULL};  \
  PyMODINIT_FUNC PyInit_##name(void) { return make_kernel_module(&name##_def); }

ASTRAI_KERNEL_MODULE(attn_decode)
ASTRAI_KERNEL_MODULE(attn_prefill)
ASTRAI_KERNEL_MODULE(attn_paged_decode)
ASTRAI_KERNEL_MODULE(attn_paged_prefill)
ASTRAI_KERNEL_MODULE(rotary_emb)
/* AstrAI's FP8 GEMM module (2026-08 on), filled from astrai_jit.astrai_fp8. */
ASTRAI_KERNEL_MODULE(fp8_mm)
/* The library's own name, so it can be imported to check it. */
ASTRAI_KERNEL_MODULE(_astrai_kernel_module)
