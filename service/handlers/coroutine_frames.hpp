#pragma once
// GCC 12 inlines Asio's awaitable-frame allocation into a coroutine and then reads the
// frame's operator delete (Asio's recycling allocator, which frees what aligned_alloc
// returned) as a mismatch (-Wmismatched-new-delete), depending on the optimizer's inlining
// (more often under -fsanitize=address). Every awaitable frame is allocated and freed by
// that same pair: nothing is mismatched. Handler files whose coroutines GCC flags wrap them
// in STATEPOOL_COROUTINES_BEGIN / STATEPOOL_COROUTINES_END (handler internals).

#if defined(__GNUC__) && !defined(__clang__)
#define STATEPOOL_COROUTINES_BEGIN \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmismatched-new-delete\"")
#define STATEPOOL_COROUTINES_END _Pragma("GCC diagnostic pop")
#else
#define STATEPOOL_COROUTINES_BEGIN
#define STATEPOOL_COROUTINES_END
#endif
