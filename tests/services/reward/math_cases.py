"""Math verification cases: (response, ground truth, extraction mode, expected correct, reason).

Grouped by what they exercise; each is one test against the running server.
"""

from __future__ import annotations

B = "last_boxed"
M = "math_verify"

CASES: list[tuple[str, str, str, bool, str]] = [
    # fractions
    (r"so \boxed{\frac{1}{2}}", "1/2", B, True, "ok"),
    (r"\boxed{0.5}", r"\frac{1}{2}", B, True, "ok"),
    (r"\boxed{\dfrac{3}{4}}", "0.75", B, True, "ok"),
    (r"\boxed{\frac{2}{4}}", r"\frac{1}{2}", B, True, "ok"),
    (r"\boxed{\frac{1}{3}}", "0.5", B, False, "wrong_answer"),
    (r"\boxed{\tfrac{5}{2}}", "2.5", B, True, "ok"),
    (r"\boxed{-\frac{7}{3}}", "-7/3", B, True, "ok"),
    (r"\boxed{\frac{7}{3}}", r"-\frac{7}{3}", B, False, "wrong_answer"),
    (r"\boxed{\frac12}", r"\frac{1}{2}", B, True, "ok"),
    # decimals
    (r"\boxed{3.14}", "3.14", B, True, "ok"),
    (r"\boxed{3.140}", "3.14", B, True, "ok"),
    (r"\boxed{3.15}", "3.14", B, False, "wrong_answer"),
    (r"\boxed{2.0}", "2", B, True, "ok"),
    (r"\boxed{1,000}", "1000", B, True, "ok"),
    (r"\boxed{0.25}", r"\frac{1}{5}", B, False, "wrong_answer"),
    # percentages
    (r"\boxed{50\%}", r"50\%", B, True, "ok"),
    (r"\boxed{50\%}", "0.5", B, True, "ok"),
    (r"\boxed{25\%}", r"50\%", B, False, "wrong_answer"),
    (r"\boxed{12.5\%}", "0.125", B, True, "ok"),
    # intervals
    (r"\boxed{[1, 2)}", "[1,2)", B, True, "ok"),
    (r"\boxed{(1, 2)}", "[1,2]", B, False, "wrong_answer"),
    (r"\boxed{(-\infty, 3]}", r"(-\infty,3]", B, True, "ok"),
    (r"\boxed{(-\infty, 3)}", r"(-\infty,3]", B, False, "wrong_answer"),
    (r"\boxed{(0,1) \cup (2,3)}", r"(0,1)\cup(2,3)", B, True, "ok"),
    # sets
    (r"\boxed{\{1, 2, 3\}}", r"\{3,2,1\}", B, True, "ok"),
    (r"\boxed{\{1, 2\}}", r"\{1,2,3\}", B, False, "wrong_answer"),
    (r"\boxed{\left\{1, 2\right\}}", r"\{2,1\}", B, True, "ok"),
    # matrices
    (
        r"\boxed{\begin{pmatrix}1&2\\3&4\end{pmatrix}}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        B,
        True,
        "ok",
    ),
    (
        r"\boxed{\begin{pmatrix}1&2\\3&5\end{pmatrix}}",
        r"\begin{pmatrix}1&2\\3&4\end{pmatrix}",
        B,
        False,
        "wrong_answer",
    ),
    (
        r"\boxed{\begin{bmatrix}1&0\\0&1\end{bmatrix}}",
        r"\begin{pmatrix}1&0\\0&1\end{pmatrix}",
        B,
        True,
        "ok",
    ),
    # symbolic expressions
    (r"\boxed{(x+1)^2}", "x^2+2x+1", B, True, "ok"),
    (r"\boxed{2\sqrt{2}}", r"\sqrt{8}", B, True, "ok"),
    (r"\boxed{(x-1)(x+1)}", "x^2-1", B, True, "ok"),
    (r"\boxed{(x+1)^2}", "x^2+1", B, False, "wrong_answer"),
    (r"\boxed{\frac{\pi}{2}}", r"\pi/2", B, True, "ok"),
    (r"\boxed{x+x}", "2x", B, True, "ok"),
    (r"\boxed{\frac{\sqrt3}{2}}", r"\frac{\sqrt{3}}{2}", B, True, "ok"),
    (r"\boxed{x = 3}", "3", B, True, "ok"),
    (r"\boxed{2^{10}}", "1024", B, True, "ok"),
    (r"\boxed{\sqrt{2}}", r"\sqrt{3}", B, False, "wrong_answer"),
    (r"\boxed{\infty}", r"\infty", B, True, "ok"),
    # units and text around the number
    (r"\boxed{5 \text{ cm}}", "5", B, True, "ok"),
    (r"\boxed{\$10}", "10", B, True, "ok"),
    (r"\boxed{90^\circ}", "90", B, True, "ok"),
    (r"\boxed{5\text{ meters}}", "6", B, False, "wrong_answer"),
    ("The area is 12 square units.\nAnswer: 12", "12", B, True, "ok"),
    ("Work...\n**Final Answer:** $\\frac{3}{4}$", "0.75", B, True, "ok"),
    ("Answer: 7.", "7", B, True, "ok"),
    ("Answer: 8", "7", B, False, "wrong_answer"),
    # multiple boxes
    (r"First \boxed{3}, no wait: \boxed{4}", "4", B, True, "ok"),
    (r"First \boxed{4}, no wait: \boxed{3}", "4", B, False, "wrong_answer"),
    (
        r"The solutions are $\boxed{(2, 2)}$ and $\boxed{(6, 2)}$.",
        "(2, 2) and (6, 2)",
        M,
        True,
        "ok",
    ),
    (r"The solution is $\boxed{(2, 2)}$.", "(2, 2) and (6, 2)", M, False, "wrong_answer"),
    (r"Hence $x = \boxed{3}$.", "3", M, True, "ok"),
    (r"The answer is $\frac{1}{2}$.", "0.5", M, True, "ok"),
    (r"Therefore the final answer is $\boxed{\{1,2\}}$.", r"\{1, 2\}", M, True, "ok"),
    # nested braces
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{\sqrt2}{2}", B, True, "ok"),
    (r"\boxed{\frac{1}{\frac{1}{2}}}", "2", B, True, "ok"),
    (r"\boxed{{{7}}}", "7", B, True, "ok"),
    (r"\boxed 5", "5", B, True, "ok"),
    (r"\fbox{5}", "5", B, True, "ok"),
    (r"\boxed{-3}", "3", B, False, "wrong_answer"),
    (r"\boxed{B}", "B", B, True, "ok"),
    (r"\boxed{C}", "B", B, False, "wrong_answer"),
    # no answer
    ("I don't know.", "3", B, False, "no_answer"),
    ("", "3", B, False, "no_answer"),
    (r"\boxed{}", "3", B, False, "no_answer"),
    (r"unbalanced \boxed{\frac{1}{2}", "1/2", B, False, "no_answer"),
    ("", "3", M, False, "no_answer"),
]

# math-verify's own regression cases (huggingface/Math-Verify, tests/test_all.py, MIT licence)
# as a yardstick for the math_verify mode: (ground truth, response, expected correct).
MATH_VERIFY_YARDSTICK: list[tuple[str, str, bool]] = [
    ("$9$", "Answer \\[ 9 \\]", True),
    ("$9$", "Answer $ 9 $", True),
    ("$9$", "Answer $$ 9 $$", True),
    ("$9$", "Answer \\( 9 \\)", True),
    ("$10$", "Answer \\( (9+1) \\)", True),
    ("$9$", "Answer \\[ \n 9 \n \\]", True),
    ("$10/9$", "Answer $ \\frac{1}{2} \\$ = \\frac{10}{9} $", True),
    ("$1/3$", "$\\frac13 $", True),
    ("$1$", "$\\frac3{3} $", True),
    ("$\\sqrt{3}$", "$\\sqrt3 $", True),
    ("$1/3$", "$\\cfrac{1}{3} $", True),
    ("$1/3$", "$\\left( \\frac{1}{3} \\right)$", True),
    ("$1/3$", "$\\frac{1}{3} \\text{meters}$", True),
    ("$1/3$", "$k = \\frac{1}{3}$", True),
    ("$28\\%$", "28 percent", True),
    ("$28\\%$", "$28$ %", True),
    ("$28\\%$", "$\\boxed{28}$ pct", True),
    ("$0.28$", "28", False),
    ("$28$", "28/100", False),
    ("$[0,9)$", "$[0,1)$", False),
    ("$(0,9)$", "$[0,9)$", False),
    ("$2-2p$", "If $2-x=p$, then $x=2-p$. Thus $x-p=\\boxed{2-2p}$.", True),
    ("$\\frac{14}{3}$", r"$f(-2)+f(-1)+f(0)=2+\frac{5}{3}+1=\boxed{\frac{14}{3}}$", True),
    ("$\\text{Evelyn}$", r"Therefore, $\boxed{\text{Evelyn}}$ is our answer.", True),
    ("10/9", "\\frac{10}{9}", True),
    ("-10/9", "-\\frac{10}{9}", True),
]
