// The one translation unit that compiles Boost.JSON (header-only mode) for the planner.
#include <boost/json/src.hpp>
