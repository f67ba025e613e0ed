#pragma once
// Boost.Asio glue: await executor operations and worker-pool tasks from the daemon's
// coroutines. The completion is posted to the awaiting coroutine's executor (its
// session's strand), and an outstanding operation keeps that io_context's run() from
// returning, as any asynchronous operation does.
//
//   co_await async_execute(executor, std::move(op), asio::use_awaitable);   // rethrows
//   auto errors = co_await async_execute_all(executor, std::move(ops), asio::use_awaitable);
//   co_await async_run(workers, [&] { arena = pool.open_arena(...); }, asio::use_awaitable);
//
// The work must not refer to anything the coroutine does not keep alive while it awaits
// (the coroutine frame itself does live until the completion).

#include <atomic>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include <boost/asio/associated_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/post.hpp>

#include "exec/executor.hpp"
#include "statepool/support/worker_pool.hpp"

namespace statepool::service {
namespace detail {

/// Wraps a completion handler taking Args... so that it can be called once from any
/// thread: it is posted to its associated executor, which is kept busy until then.
template <class... Args, class Handler>
std::function<void(Args...)> post_back(Handler&& handler) {
  using Decayed = std::decay_t<Handler>;
  auto shared = std::make_shared<Decayed>(std::forward<Handler>(handler));
  auto work = std::make_shared<
      boost::asio::executor_work_guard<boost::asio::associated_executor_t<Decayed>>>(
      boost::asio::make_work_guard(boost::asio::get_associated_executor(*shared)));
  return [shared, work](Args... args) {
    auto executor = work->get_executor();
    boost::asio::post(executor, [shared, ... values = std::move(args)]() mutable {
      std::move (*shared)(std::move(values)...);
    });
    work->reset();
  };
}

}  // namespace detail

/// Submits `op` and completes with void(std::exception_ptr) (use_awaitable rethrows it).
template <class CompletionToken>
auto async_execute(Executor& executor, Operation op, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void(std::exception_ptr)>(
      [&executor](auto handler, Operation operation) {
        executor.submit(std::move(operation),
                        detail::post_back<std::exception_ptr>(std::move(handler)));
      },
      token, std::move(op));
}

/// Submits every operation of `ops` at once (the executor runs them side by side: the
/// entries of a batched request) and completes once, when the last one has, with
/// void(std::vector<std::exception_ptr>): one per operation, in order, null for those that
/// succeeded. An empty `ops` completes at once.
template <class CompletionToken>
auto async_execute_all(Executor& executor, std::vector<Operation> ops, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void(std::vector<std::exception_ptr>)>(
      [&executor](auto handler, std::vector<Operation> operations) {
        struct Shared {
          std::vector<std::exception_ptr> errors;
          std::atomic<std::size_t> left{0};
          std::function<void(std::vector<std::exception_ptr>)> deliver;
        };
        auto shared = std::make_shared<Shared>();
        shared->errors.resize(operations.size());
        shared->left.store(operations.size());
        shared->deliver = detail::post_back<std::vector<std::exception_ptr>>(std::move(handler));
        if (operations.empty()) {
          shared->deliver({});
          return;
        }
        for (std::size_t i = 0; i < operations.size(); ++i) {
          executor.submit(std::move(operations[i]), [shared, i](std::exception_ptr error) {
            shared->errors[i] = std::move(error);
            if (shared->left.fetch_sub(1) == 1) shared->deliver(std::move(shared->errors));
          });
        }
      },
      token, std::move(ops));
}

/// Submits `op` and completes once with void(std::exception_ptr,
/// std::optional<IpcEventBytes>): with the event as soon as the executor has the work on a
/// device stream (executors that export events), else when the work is done (no event,
/// its error if any). An error that comes after the early completion is given to `late`
/// (on an executor thread; it must not block), as nobody awaits it any more.
template <class CompletionToken>
auto async_execute_early(Executor& executor, Operation op,
                         std::function<void(std::exception_ptr)> late, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken,
                                     void(std::exception_ptr, std::optional<IpcEventBytes>)>(
      [&executor](auto handler, Operation operation,
                  std::function<void(std::exception_ptr)> on_late) {
        // Whichever comes first, the early event or the completion, answers; the flag
        // makes it one of them.
        auto fired = std::make_shared<std::atomic<bool>>(false);
        auto deliver =
            detail::post_back<std::exception_ptr, std::optional<IpcEventBytes>>(std::move(handler));
        operation.enqueued = [fired, deliver](const IpcEventBytes& event) {
          if (!fired->exchange(true)) deliver(nullptr, event);
        };
        executor.submit(std::move(operation),
                        [fired, deliver, on_late = std::move(on_late)](std::exception_ptr error) {
                          if (!fired->exchange(true)) {
                            deliver(std::move(error), std::nullopt);
                          } else if (error && on_late) {
                            on_late(std::move(error));
                          }
                        });
      },
      token, std::move(op), std::move(late));
}

/// Runs `task()` on a worker and completes with void(std::exception_ptr): its exception,
/// if it threw. Results travel through what the task captures by reference.
template <class Task, class CompletionToken>
auto async_run(support::WorkerPool& workers, Task task, CompletionToken&& token) {
  return boost::asio::async_initiate<CompletionToken, void(std::exception_ptr)>(
      [&workers](auto handler, Task work) {
        workers.post([work = std::move(work),
                      done = detail::post_back<std::exception_ptr>(std::move(handler))]() mutable {
          std::exception_ptr error;
          try {
            work();
          } catch (...) {
            error = std::current_exception();
          }
          done(std::move(error));
        });
      },
      token, std::move(task));
}

}  // namespace statepool::service
