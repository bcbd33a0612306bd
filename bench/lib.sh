# lib.sh — shared by the benchmark scripts (sourced).

# The command as run, for a run's description: SCRIPT (its path inside the checkout) and its
# arguments, with the value after --dsn replaced by DSN (it may hold a password) and paths
# inside the checkout ROOT made relative to it. Usage: bench_command_line ROOT SCRIPT "$@"
bench_command_line() {
    local root=$1 line=$2 prev= a
    shift 2
    for a in "$@"; do
        if [ "$prev" = --dsn ]; then a=DSN; fi
        a=${a#"$root"/}
        line+=" $a"
        prev=$a
    done
    printf '%s\n' "$line"
}

# The gnuplot settings every clustered-histogram plot starts from.
bench_gnuplot_histogram='set terminal pngcairo noenhanced size 1100,560 font ",10"
set datafile separator "\t"
set style data histogram
set style histogram cluster gap 1
set style fill solid 0.85 border -1
set boxwidth 0.9
set grid ytics
set key top left
set xtics rotate by -25'

# The INSERT baseline's table: bench_insert.events, made LIKE the newest partition of pawl.events
# (its columns, constraints, defaults and every index), and the sequence its rows number from.
# Usage: bench_insert_twin DSN (a database with pawl's schema).
bench_insert_twin() {
    psql "$1" -Xq -v ON_ERROR_STOP=1 >/dev/null <<'SQL'
CREATE SCHEMA bench_insert;
DO $$
BEGIN
    EXECUTE format('CREATE TABLE bench_insert.events (LIKE pawl.%I INCLUDING ALL)',
                   (SELECT relname FROM pawl.event_parts WHERE hi IS NULL));
END
$$;
CREATE SEQUENCE bench_insert.seq START 1000000;
SQL
}
