#include <stdexcept>
#include <string>

#include "statepool/kernels/cuda/codec_kernels.hpp"
#include "statepool/kernels/format.hpp"

namespace statepool::kernels::cuda {

PageDesc make_page_desc(const StateLayout& layout, DType staged_dtype) {
  if (const std::string problem = validate(layout); !problem.empty()) {
    throw std::invalid_argument("invalid layout: " + problem);
  }
  if (staged_dtype != DType::f32 && staged_dtype != DType::bf16) {
    throw std::invalid_argument(std::string("staged states are f32 or bf16, got ") +
                                to_string(staged_dtype));
  }
  if (!is_float_codec(layout.codec.id) && !is_uniform_codec(layout.codec.id)) {
    throw std::invalid_argument(std::string("no CUDA kernel for codec ") +
                                to_string(layout.codec.id));
  }
  PageDesc d;
  d.codec = layout.codec.id;
  d.staged_dtype = staged_dtype;
  d.group_size = is_uniform_codec(d.codec) ? effective_group_size(layout.codec.group_size) : 0;
  d.key_dim = layout.key_dim;
  d.value_dim = layout.value_dim;
  d.num_heads = layout.num_layers * layout.num_heads;
  d.head_bytes = head_bytes_for(layout.codec, layout.key_dim, layout.value_dim);
  d.conv_bytes = std::uint64_t{layout.num_layers} * layout.conv_channels * layout.conv_width *
                 dtype_bytes(layout.conv_dtype);
  return d;
}

}  // namespace statepool::kernels::cuda
