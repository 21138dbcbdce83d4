#include "core/tensor.h"

namespace qvl {

std::string Tensor::shape_string() const {
  std::string s = "[";
  for (int i = 0; i < ndim; ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Tensor::describe() const { return std::string(dtype_name(dtype)) + shape_string(); }

bool Tensor::same_shape(const Tensor& o) const {
  if (ndim != o.ndim) return false;
  for (int i = 0; i < ndim; ++i)
    if (shape[i] != o.shape[i]) return false;
  return true;
}

}  // namespace qvl
