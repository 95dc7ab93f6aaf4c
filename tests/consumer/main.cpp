// Links against astrai::jit and exercises the public API without needing a GPU.
#include <astrai/runtime.hpp>

#include <cstdio>

int main() {
  astrai::PagedDecodeArgs args;
  args.batch = 0;  // nothing to do: returns before touching the GPU
  args.n_heads = 32;
  args.n_kv_heads = 8;
  args.head_dim = 128;
  args.page_size = 16;
  args.num_pages = 1;
  args.max_pages_per_seq = 512;
  astrai::Runtime::get().paged_decode(args);
  const std::size_t workspace = astrai::paged_decode_workspace_bytes(args, 132);
  args.head_dim = 72;
  try {
    astrai::Runtime::get().paged_decode(args);
    std::puts("consumer: expected an InvalidArgument for head_dim 72");
    return 1;
  } catch (const astrai::InvalidArgument& error) {
    std::printf("consumer: ok (workspace %zu bytes; rejected: %s)\n", workspace, error.what());
  }
  return 0;
}
