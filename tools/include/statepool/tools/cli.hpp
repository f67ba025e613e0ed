#pragma once
// The command-line prologue every statepool tool shares (statepoolctl, statepool-demo,
// statepool-quant, the benchmarks): Boost.Program_options, as statepoold uses, and one way
// of answering --help and a bad command line.
//
//   statepool::tools::CommandLine cli("statepoolctl", kUsage);
//   cli.add_options()
//       ("socket", po::value(&args.socket))
//       ("count", statepool::tools::bounded(args.count, 1, 1000000));
//   cli.positional("command", args.command);
//   if (const auto exit_status = cli.parse(argc, argv)) return *exit_status;
//
// Options are `--name value` or `--name=value` and are never abbreviated (a new option
// cannot break a script that used a prefix of an old one); one given twice is an error
// unless it is declared repeatable (po::value<std::vector<T>>). The variables an option
// is bound to keep their initial values when it is not given: defaults live there, once.
// -h/--help prints the tool's usage text on stdout (exit 0); a bad command line prints
// "TOOL: MESSAGE", a blank line and the usage on stderr (exit kUsageExit).
//
// Header-only; link statepool::tool_cli. Tools only: the client library stays free of
// Boost.

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <string_view>
#include <system_error>
#include <type_traits>
#include <utility>
#include <vector>

#include <boost/program_options.hpp>

namespace statepool::tools {

namespace po = boost::program_options;

/// The exit status of a bad command line, in every tool.
inline constexpr int kUsageExit = 2;

/// A bad command line that program_options cannot see (no command, options that do not go
/// together, an operand that does not fit what an input file holds): reported like
/// program_options' own errors, with the usage and kUsageExit.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Prints "TOOL: MESSAGE", a blank line and `usage` on stderr; returns kUsageExit.
inline int report_usage_error(std::string_view tool, std::string_view message,
                              std::string_view usage) {
  std::cerr << tool << ": " << message << "\n\n" << usage;
  return kUsageExit;
}

namespace detail {

// A text option checked as it is read (in po::store, where program_options adds the
// option's name to its own errors), before notify() looks for missing required options.
class CheckedText final : public po::typed_value<std::string> {
 public:
  explicit CheckedText(std::function<void(const std::string&)> check)
      : po::typed_value<std::string>(nullptr), check_(std::move(check)) {}
  void xparse(boost::any& store, const std::vector<std::string>& tokens) const override {
    po::typed_value<std::string>::xparse(store, tokens);  // one value, given once
    check_(boost::any_cast<const std::string&>(store));
  }

 private:
  std::function<void(const std::string&)> check_;
};

// An error of the option being read: program_options fills in %canonical_option% with the
// option as it was written ("--count").
inline po::error_with_option_name bad_value(const std::string& problem, const std::string& text) {
  po::error_with_option_name error("%canonical_option% " + problem);
  error.set_substitute("value", text);
  return error;
}

template <class T>
struct Unwrap {
  using type = T;
};
template <class T>
struct Unwrap<std::optional<T>> {
  using type = T;
};

}  // namespace detail

/// An option read by `parse` (const std::string& -> the value) into `out`: a T, or a
/// std::optional<T> that is set only when the option is given. `parse` throws for a bad
/// value (UsageError with a message that names the option, or po::error_with_option_name);
/// it runs as the option is read, so a bad value is reported before a missing required
/// option. Add ->required() for an option that must be given.
template <class Out, class Parse>
po::typed_value<std::string>* parsed(Out& out, Parse parse) {
  // program_options owns its value semantics (options_description holds them in a
  // shared_ptr), as with po::value().
  auto* value = new detail::CheckedText([parse](const std::string& text) { (void)parse(text); });
  return value->notifier([&out, parse](const std::string& text) { out = parse(text); });
}

/// A text option whose absence matters: `out` is set only when it is given.
inline po::typed_value<std::string>* optional_value(std::optional<std::string>& out) {
  return parsed(out, [](const std::string& text) { return text; });
}

/// An unsigned integer option within [min, max] (max: at most T's largest value), read
/// into `out` (an unsigned T, or a std::optional<T>): "--count expects a number, got 'x'",
/// "--count must be between 1 and 1000000, got 0". Decimal digits only (program_options'
/// own reading of an unsigned would wrap "-1" around to the largest value).
template <class Out>
po::typed_value<std::string>* bounded(
    Out& out, std::uint64_t min = 0,
    std::uint64_t max = std::numeric_limits<std::uint64_t>::max()) {
  using T = typename detail::Unwrap<Out>::type;
  static_assert(std::is_unsigned_v<T>, "bounded() reads unsigned integers");
  max = std::min<std::uint64_t>(max, std::numeric_limits<T>::max());
  return parsed(out, [min, max](const std::string& text) {
    std::uint64_t value = 0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ptr != end || (ec != std::errc{} && ec != std::errc::result_out_of_range))
      throw detail::bad_value("expects a number, got '%value%'", text);
    if (ec == std::errc::result_out_of_range || value < min || value > max) {
      throw detail::bad_value("must be between " + std::to_string(min) + " and " +
                                  std::to_string(max) + ", got %value%",
                              text);
    }
    return static_cast<T>(value);
  });
}

/// A finite floating-point option, read into `out`: "--gamma must be a number, got 'x'".
/// Range checks belong to the tool.
inline po::typed_value<std::string>* finite(double& out) {
  return parsed(out, [](const std::string& text) {
    double value = 0.0;
    const char* end = text.data() + text.size();
    const auto [ptr, ec] = std::from_chars(text.data(), end, value);
    if (text.empty() || ec != std::errc{} || ptr != end || !std::isfinite(value))
      throw detail::bad_value("must be a number, got '%value%'", text);
    return value;
  });
}

/// One tool's (or one subcommand's) command line: its options, its positional arguments
/// and its usage text.
class CommandLine {
 public:
  /// `tool` starts every message ("statepoolctl: ..."); `usage` is what --help prints.
  CommandLine(std::string tool, std::string usage)
      : tool_(std::move(tool)), usage_(std::move(usage)) {
    options_.add_options()("help,h", po::bool_switch());
  }

  /// Declares options: add_options()("name", po::value(&variable))("flag", po::bool_switch(&on)).
  po::options_description_easy_init add_options() { return options_.add_options(); }

  /// The next `count` positional arguments (-1: all the rest) go to `out`. A positional
  /// argument past the declared ones is an error that quotes it.
  template <class T>
  CommandLine& positional(const char* name, T& out, int count = 1) {
    options_.add_options()(name, po::value<T>(&out));
    positional_.add(name, count);
    positional_names_.insert(name);
    return *this;
  }

  /// Parses argv, stores every value in its variable and runs `check` (which may throw
  /// UsageError). Returns the exit status to leave with now: 0 after --help (answered
  /// before required options and `check` are looked at, so `TOOL CMD --help` needs none
  /// of CMD's required options), kUsageExit after a bad command line (reported); nullopt
  /// to go on.
  std::optional<int> parse(int argc, const char* const* argv,
                           const std::function<void(const po::variables_map&)>& check = {}) {
    try {
      po::parsed_options parsed = po::command_line_parser(argc, argv)
                                      .options(options_)
                                      .style(po::command_line_style::default_style &
                                             ~po::command_line_style::allow_guessing)
                                      .run();
      // Positional arguments are named here rather than by .positional(): program_options
      // would refuse an extra one without saying which.
      unsigned position = 0;
      for (po::option& option : parsed.options) {
        if (option.position_key < 0) {
          // A positional name is not an option: --command ping is refused.
          if (positional_names_.count(option.string_key) != 0)
            throw po::unknown_option(option.original_tokens.front());
          continue;
        }
        if (position >= positional_.max_total_count())
          throw UsageError("unexpected argument '" + option.value.front() + "'");
        option.string_key = positional_.name_for_position(position++);
      }
      po::variables_map values;
      po::store(parsed, values);
      if (values["help"].as<bool>()) {
        std::cout << usage_;
        return 0;
      }
      po::notify(values);
      if (check) check(values);
      return std::nullopt;
    } catch (const po::error& e) {
      return usage_error(e.what());
    } catch (const UsageError& e) {
      return usage_error(e.what());
    }
  }

 private:
  int usage_error(std::string_view message) const {
    return report_usage_error(tool_, message, usage_);
  }

  std::string tool_;
  std::string usage_;
  po::options_description options_;
  po::positional_options_description positional_;
  std::set<std::string> positional_names_;
};

}  // namespace statepool::tools
