// Boost.URL is header-only here: its implementation is compiled once, in this file, for
// the whole program (as planner/boost_json.cpp does for Boost.JSON). Nothing else may
// include <boost/url/src.hpp>.
#include <boost/url/src.hpp>
