// pybind11 module wyoming_kazeia._native, grouped by audience: the product classes in the
// module itself, the converter's format tables in _native.formats, test hooks and bench probes
// in _native.testing (development builds only: KAZEIA_TESTING). The product's Python goes
// through wyoming_kazeia.native.
#include <exception>

#include "common.h"
#include "kazeia/error.h"

namespace py = pybind11;

PYBIND11_MODULE(_native, m) {
    m.doc() = "Kazeia TTS native engine (ggml)";
    // The native errors are raised as the package's own error classes (wyoming_kazeia.errors):
    // one family for every error, in C++ or Python.
    py::module_ errors = py::module_::import("wyoming_kazeia.errors");
    // Kept for the life of the process: the translator below runs at any later time.
    static PyObject *model_error = py::object(errors.attr("ModelError")).release().ptr();
    static PyObject *input_error = py::object(errors.attr("InputError")).release().ptr();
    py::register_exception_translator([](std::exception_ptr p) {
        try {
            if (p) std::rethrow_exception(p);
        } catch (const kazeia::ModelError &e) {
            PyErr_SetString(model_error, e.what());
        } catch (const kazeia::InputError &e) {
            PyErr_SetString(input_error, e.what());
        }
    });
    m.attr("ModelError") = errors.attr("ModelError");
    m.attr("InputError") = errors.attr("InputError");

    kazeia::bindings::def_engine(m);
    kazeia::bindings::def_voices(m);
    py::module_ formats = m.def_submodule("formats", "Format tables of the model parts (converter)");
    kazeia::bindings::def_formats(formats);
#if KAZEIA_TESTING
    py::module_ testing = m.def_submodule("testing", "Test hooks and bench probes");
    kazeia::bindings::def_testing(testing);
#endif
}
