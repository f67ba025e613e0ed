#include "statepool/support/read_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <stdexcept>

#include "statepool/support/errno_text.hpp"
#include "statepool/support/unique_fd.hpp"

namespace statepool::support {

std::string read_file(const std::string& path, std::size_t max_bytes) {
  const UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) throw std::runtime_error(path + ": cannot open: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0)
    throw std::runtime_error(path + ": cannot stat: " + errno_text(errno));
  if (S_ISDIR(st.st_mode)) throw std::runtime_error(path + ": is a directory");
  if (!S_ISREG(st.st_mode)) throw std::runtime_error(path + ": not a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    throw std::runtime_error(path + ": file of " + std::to_string(size) +
                             " bytes is larger than the limit of " + std::to_string(max_bytes));
  }
  std::string text(static_cast<std::size_t>(size), '\0');
  std::size_t got = 0;
  while (got < text.size()) {
    const ssize_t n =
        ::pread(fd.get(), text.data() + got, text.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw std::runtime_error(path + ": read failed: " + errno_text(errno));
    if (n == 0) throw std::runtime_error(path + ": read failed: unexpected end of file");
    got += static_cast<std::size_t>(n);
  }
  return text;
}

}  // namespace statepool::support
