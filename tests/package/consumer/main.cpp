// What an engine does with the installed client package, without a daemon: builds the
// page format of a layout and round-trips a state through it locally, and gets a clear
// ConnectionError (not a hang, not a crash) when no daemon listens.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "statepool/client.hpp"
#include "statepool/kernels/page.hpp"

int main(int argc, char** argv) {
  namespace sc = statepool::client;
  namespace k = statepool::kernels;
  k::StateLayout layout;
  layout.name = "consumer";
  layout.num_layers = 2;
  layout.num_heads = 4;
  layout.key_dim = 16;
  layout.value_dim = 16;
  layout.codec.id = k::CodecId::int8;
  const k::PageCodec codec(layout);
  std::vector<std::byte> state(codec.staged_bytes(k::DType::f32));
  for (std::size_t i = 0; i < state.size() / 4; ++i) {
    const float v = static_cast<float>(i % 17) / 17.0f;
    std::memcpy(state.data() + 4 * i, &v, 4);
  }
  std::vector<std::byte> page(codec.page_bytes());
  codec.encode(state, k::DType::f32, page);
  std::vector<std::byte> back(state.size());
  codec.decode(page, k::DType::f32, back);
  float first = 0;
  std::memcpy(&first, back.data() + 4, 4);
  if (first < 0.05f || first > 0.07f) {
    std::fprintf(stderr, "consumer: decoded %g, expected about 1/17\n", first);
    return 1;
  }

  sc::Options options;
  options.socket_path = argc > 1 ? argv[1] : "/nonexistent/statepool.sock";
  options.timeout = std::chrono::milliseconds(2000);
  try {
    (void)sc::Connection::connect(options);
    std::fprintf(stderr, "consumer: connected to %s, expected no daemon there\n",
                 options.socket_path.c_str());
    return 1;
  } catch (const sc::ConnectionError& e) {
    if (e.kind() != sc::ConnectionError::Kind::connect_failed) {
      std::fprintf(stderr, "consumer: %s: %s\n", sc::to_string(e.kind()), e.what());
      return 1;
    }
  }
  std::printf("consumer: page of %zu bytes (%.2fx), no daemon at %s: ok\n", codec.page_bytes(),
              codec.compression_ratio(), options.socket_path.c_str());
  return 0;
}
