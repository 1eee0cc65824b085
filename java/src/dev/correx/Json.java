package dev.correx;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The JSON correx speaks, in plain Java values: objects are {@code Map<String, Object>} (in
 * order), arrays {@code List<Object>}, strings {@code String}, integers {@code Long} (or
 * {@code BigInteger} past 64 bits), other numbers {@code Double}, booleans {@code Boolean},
 * and null {@code null}. Enough for correx's payloads; no dependency.
 */
public final class Json {
    private Json() {}

    /**
     * Parses one JSON value.
     *
     * @throws InvalidArgumentException when {@code text} is not JSON
     */
    public static Object parse(String text) {
        if (text == null) {
            throw new InvalidArgumentException(CorrexException.E_NULL, "JSON text is null");
        }
        Parser p = new Parser(text);
        p.space();
        Object v = p.value(0);
        p.space();
        if (p.i != text.length()) {
            throw p.error("unexpected text after the value");
        }
        return v;
    }

    /**
     * Parses a JSON object.
     *
     * @throws InvalidArgumentException when {@code text} is not a JSON object
     */
    @SuppressWarnings("unchecked")
    public static Map<String, Object> parseObject(String text) {
        Object v = parse(text);
        if (!(v instanceof Map)) {
            throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, "expected a JSON object");
        }
        return (Map<String, Object>) v;
    }

    /**
     * Writes {@code value} (Map, List/array, CharSequence, Number, Boolean, null) as JSON.
     *
     * @throws InvalidArgumentException for a value of another type, a non-finite number, or a
     *     map key that is not a string
     */
    public static String write(Object value) {
        StringBuilder b = new StringBuilder();
        write(b, value, 0);
        return b.toString();
    }

    private static void write(StringBuilder b, Object v, int depth) {
        if (depth > 256) {
            throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, "JSON nested too deep");
        }
        if (v == null) {
            b.append("null");
        } else if (v instanceof CharSequence) {
            string(b, v.toString());
        } else if (v instanceof Boolean) {
            b.append(v);
        } else if (v instanceof Double || v instanceof Float) {
            double d = ((Number) v).doubleValue();
            if (Double.isNaN(d) || Double.isInfinite(d)) {
                throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, "JSON has no " + d);
            }
            if (d == Math.rint(d) && Math.abs(d) < 1e15) {
                b.append((long) d);
            } else {
                // A float's own shortest form, not its widened double's.
                b.append(v instanceof Float ? Float.toString((Float) v) : Double.toString(d));
            }
        } else if (v instanceof Number) {
            b.append(v);
        } else if (v instanceof Map) {
            b.append('{');
            boolean first = true;
            for (Map.Entry<?, ?> e : ((Map<?, ?>) v).entrySet()) {
                if (!(e.getKey() instanceof String)) {
                    throw new InvalidArgumentException(CorrexException.E_INVALID_ARGUMENT, "JSON object keys are strings");
                }
                if (!first) b.append(',');
                first = false;
                string(b, (String) e.getKey());
                b.append(':');
                write(b, e.getValue(), depth + 1);
            }
            b.append('}');
        } else if (v instanceof Iterable) {
            b.append('[');
            boolean first = true;
            for (Object o : (Iterable<?>) v) {
                if (!first) b.append(',');
                first = false;
                write(b, o, depth + 1);
            }
            b.append(']');
        } else if (v instanceof Object[]) {
            write(b, java.util.Arrays.asList((Object[]) v), depth);
        } else {
            throw new InvalidArgumentException(
                    CorrexException.E_INVALID_ARGUMENT, "cannot write a " + v.getClass().getName() + " as JSON");
        }
    }

    private static void string(StringBuilder b, String s) {
        b.append('"');
        for (int i = 0; i < s.length(); i++) {
            char c = s.charAt(i);
            switch (c) {
                case '"': b.append("\\\""); break;
                case '\\': b.append("\\\\"); break;
                case '\n': b.append("\\n"); break;
                case '\r': b.append("\\r"); break;
                case '\t': b.append("\\t"); break;
                default:
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
            }
        }
        b.append('"');
    }

    private static final class Parser {
        final String s;
        int i;

        Parser(String s) {
            this.s = s;
        }

        InvalidArgumentException error(String what) {
            return new InvalidArgumentException(
                    CorrexException.E_INVALID_ARGUMENT, "malformed JSON at offset " + i + ": " + what);
        }

        void space() {
            while (i < s.length()) {
                char c = s.charAt(i);
                if (c == ' ' || c == '\n' || c == '\r' || c == '\t') i++;
                else break;
            }
        }

        Object value(int depth) {
            if (depth > 256) throw error("nested too deep");
            if (i >= s.length()) throw error("unexpected end");
            char c = s.charAt(i);
            switch (c) {
                case '{': return object(depth);
                case '[': return array(depth);
                case '"': return string();
                case 't': return literal("true", Boolean.TRUE);
                case 'f': return literal("false", Boolean.FALSE);
                case 'n': return literal("null", null);
                default:
                    if (c == '-' || (c >= '0' && c <= '9')) return number();
                    throw error("unexpected '" + c + "'");
            }
        }

        Object literal(String word, Object v) {
            if (!s.startsWith(word, i)) throw error("expected " + word);
            i += word.length();
            return v;
        }

        Map<String, Object> object(int depth) {
            Map<String, Object> m = new LinkedHashMap<>();
            i++;
            space();
            if (i < s.length() && s.charAt(i) == '}') {
                i++;
                return m;
            }
            while (true) {
                space();
                if (i >= s.length() || s.charAt(i) != '"') throw error("expected a key");
                String k = string();
                space();
                if (i >= s.length() || s.charAt(i) != ':') throw error("expected ':'");
                i++;
                space();
                m.put(k, value(depth + 1));
                space();
                if (i >= s.length()) throw error("unexpected end");
                char c = s.charAt(i++);
                if (c == '}') return m;
                if (c != ',') throw error("expected ',' or '}'");
            }
        }

        List<Object> array(int depth) {
            List<Object> l = new ArrayList<>();
            i++;
            space();
            if (i < s.length() && s.charAt(i) == ']') {
                i++;
                return l;
            }
            while (true) {
                space();
                l.add(value(depth + 1));
                space();
                if (i >= s.length()) throw error("unexpected end");
                char c = s.charAt(i++);
                if (c == ']') return l;
                if (c != ',') throw error("expected ',' or ']'");
            }
        }

        String string() {
            i++;
            StringBuilder b = new StringBuilder();
            while (true) {
                // Plain runs are copied whole.
                int run = i;
                while (run < s.length()) {
                    char c = s.charAt(run);
                    if (c == '"' || c == '\\' || c < 0x20) break;
                    run++;
                }
                b.append(s, i, run);
                i = run;
                if (i >= s.length()) throw error("unterminated string");
                char c = s.charAt(i++);
                if (c == '"') return b.toString();
                if (c == '\\') {
                    if (i >= s.length()) throw error("unterminated escape");
                    char e = s.charAt(i++);
                    switch (e) {
                        case '"': b.append('"'); break;
                        case '\\': b.append('\\'); break;
                        case '/': b.append('/'); break;
                        case 'b': b.append('\b'); break;
                        case 'f': b.append('\f'); break;
                        case 'n': b.append('\n'); break;
                        case 'r': b.append('\r'); break;
                        case 't': b.append('\t'); break;
                        case 'u': {
                            if (i + 4 > s.length()) throw error("short \\u escape");
                            int code = 0;
                            for (int k = 0; k < 4; k++) {
                                int digit = Character.digit(s.charAt(i + k), 16);
                                if (digit < 0) throw error("bad \\u escape");
                                code = code * 16 + digit;
                            }
                            b.append((char) code);
                            i += 4;
                            break;
                        }
                        default: throw error("bad escape");
                    }
                } else if (c < 0x20) {
                    throw error("control character in a string");
                } else {
                    b.append(c);
                }
            }
        }

        private int digits() {
            int from = i;
            while (i < s.length() && s.charAt(i) >= '0' && s.charAt(i) <= '9') i++;
            return i - from;
        }

        /** RFC 8259's number: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)? */
        Object number() {
            int start = i;
            if (s.charAt(i) == '-') i++;
            int intStart = i;
            if (digits() == 0) throw error("a number needs digits");
            if (s.charAt(intStart) == '0' && i - intStart > 1) throw error("a number has no leading zeros");
            boolean integral = true;
            if (i < s.length() && s.charAt(i) == '.') {
                i++;
                integral = false;
                if (digits() == 0) throw error("a fraction needs digits");
            }
            if (i < s.length() && (s.charAt(i) == 'e' || s.charAt(i) == 'E')) {
                i++;
                integral = false;
                if (i < s.length() && (s.charAt(i) == '+' || s.charAt(i) == '-')) i++;
                if (digits() == 0) throw error("an exponent needs digits");
            }
            String t = s.substring(start, i);
            if (integral) {
                BigInteger big = new BigInteger(t);
                return big.bitLength() < 64 ? (Object) big.longValue() : big;
            }
            double d;
            try {
                d = new BigDecimal(t).doubleValue();
            } catch (NumberFormatException | ArithmeticException x) {
                throw error("the number " + t + " is out of range");
            }
            if (Double.isInfinite(d)) throw error("the number " + t + " is out of range");
            return d;
        }
    }

    // Typed reads of parsed values, for the classes of this package.

    static String str(Map<String, Object> m, String k) {
        Object v = m.get(k);
        return v == null ? null : v.toString();
    }

    static long num(Map<String, Object> m, String k, long dflt) {
        Object v = m.get(k);
        return v instanceof Number ? ((Number) v).longValue() : dflt;
    }

    static Long numOrNull(Map<String, Object> m, String k) {
        Object v = m.get(k);
        return v instanceof Number ? ((Number) v).longValue() : null;
    }

    static boolean bool(Map<String, Object> m, String k) {
        return Boolean.TRUE.equals(m.get(k));
    }

    @SuppressWarnings("unchecked")
    static Map<String, Object> obj(Map<String, Object> m, String k) {
        Object v = m.get(k);
        return v instanceof Map ? (Map<String, Object>) v : Collections.emptyMap();
    }

    @SuppressWarnings("unchecked")
    static List<Object> list(Map<String, Object> m, String k) {
        Object v = m.get(k);
        return v instanceof List ? (List<Object>) v : Collections.emptyList();
    }

    /** The objects of the array {@code m.k}, each read with {@code read}, unmodifiable. */
    @SuppressWarnings("unchecked")
    static <T> List<T> objects(Map<String, Object> m, String k, java.util.function.Function<Map<String, Object>, T> read) {
        List<T> out = new ArrayList<>();
        for (Object o : list(m, k)) {
            out.add(read.apply(o instanceof Map ? (Map<String, Object>) o : Collections.emptyMap()));
        }
        return Collections.unmodifiableList(out);
    }

    static List<String> strings(Map<String, Object> m, String k) {
        List<String> out = new ArrayList<>();
        for (Object o : list(m, k)) {
            out.add(o == null ? null : o.toString());
        }
        return Collections.unmodifiableList(out);
    }
}
