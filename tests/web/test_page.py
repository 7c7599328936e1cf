"""The web page in a real headless Chromium, over the real daemon, kernel and matplotlib that
`prime-agent web` started: the issue's acceptance path, hostile text, and the page without a login."""

from __future__ import annotations

import http.server
import re
import threading

import httpx2
import pytest
from selenium.common.exceptions import NoAlertPresentException, StaleElementReferenceException
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys

from tests.web.conftest import XSS, Web, console_errors, shoot, wait_for

pytestmark = pytest.mark.timeout(300)


def login(browser, web: Web) -> None:
    browser.get_log("browser")  # read: what an earlier test left there is not this test's
    browser.get(web.url)
    wait_for(lambda: _buttons(browser, "New session"), what="the sessions list")
    assert "token" not in browser.current_url  # dropped from the address bar


def new_session(browser, web: Web) -> str:
    press(browser, "New session")
    directory = browser.find_element(By.CSS_SELECTOR, "input[aria-label=Directory]")
    assert directory.get_attribute("value") == str(web.project)  # where `prime-agent web` was started
    press(browser, "Create")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "textarea[aria-label=Message]"), what="the session view")
    return browser.current_url.rsplit("/", 1)[1]


def send(browser, *lines: str) -> None:
    box = browser.find_element(By.CSS_SELECTOR, "textarea[aria-label=Message]")
    for i, line in enumerate(lines):
        if i:
            box.send_keys(Keys.SHIFT, Keys.ENTER)  # a new line, not sent
        box.send_keys(line)
    box.send_keys(Keys.ENTER)
    wait_for(lambda: box.get_attribute("value") == "", what="the message to be sent")


def texts(browser, css: str) -> list[str]:
    """The shown text of each element `css` matches, read at once (the page may redraw between reads)."""
    return browser.execute_script("return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText)", css)


def press(browser, label: str) -> None:
    """Click the button `label`, scrolled to the middle of the page first (as a person scrolls to it:
    not under the bar at the top nor the composer at the bottom)."""
    def clicked() -> bool:
        try:
            buttons = _buttons(browser, label)
            if not buttons:
                return False
            button = buttons[0]
            browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", button)
            button.click()
            return True
        except StaleElementReferenceException:  # the page redrew it meanwhile
            return False

    wait_for(clicked, what=f"the button {label!r}")


def _buttons(browser, label: str) -> list:
    try:
        return [b for b in browser.find_elements(By.XPATH, f"//button[normalize-space()='{label}']") if b.is_displayed()]
    except StaleElementReferenceException:
        return []


def test_new_session_streams_a_cell_and_an_answer_is_steered_and_stopped_takes_approvals_shows_a_plot_and_survives_a_reload(
        web, browser):
    login(browser, web)
    session = new_session(browser, web)

    go = web.project / "go"
    send(browser, "run: import os, time", "print('first', flush=True)",
         "while not os.path.exists('go'): time.sleep(0.05)", "print('second')")
    output = ".cell pre.output"
    wait_for(lambda: "first" in "".join(texts(browser, output)), what="the cell's first line, while it runs")
    assert "second" not in "".join(texts(browser, output))  # it streams: the cell waits for `go`
    assert _buttons(browser, "Steer") and _buttons(browser, "Stop")  # a turn runs: Enter steers it
    send(browser, "also mind the tests")
    go.write_text("")
    wait_for(lambda: "second" in "".join(texts(browser, output)), what="the cell's second line")
    answer = ".message.assistant .text"
    wait_for(lambda: any("steered: also mind the tests" in t for t in texts(browser, answer)),
             what="the model's answer to the steering")
    assert any("steer delivered: also mind the tests" in t for t in texts(browser, ".notice"))

    send(browser, "stream")
    wait_for(lambda: any("The answer streams:" in t for t in texts(browser, answer)), what="half an answer")
    assert not any("second half" in t for t in texts(browser, answer))  # the model has not sent the rest yet
    web.model.go.set()
    wait_for(lambda: any("then the second half." in t for t in texts(browser, answer)), what="the whole answer")

    send(browser, "run: while True: time.sleep(0.05)")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".cell.running"), what="the endless cell")
    press(browser, "Stop")
    wait_for(lambda: any(t.startswith("turn interrupted") for t in texts(browser, ".notice")), what="the stopped turn")

    send(browser, "run: print((await request_permission('echo approved-ok')).stdout, end='')",
         "print((await request_permission('echo always-ok')).stdout, end='')",
         "print((await request_permission('echo always-ok')).stdout, end='')",  # the rule answers it
         "try: await request_permission('echo denied-ok')", "except PermissionError as e: print(e)")
    card = ".card.approval:not(.decided) pre.summary"
    wait_for(lambda: texts(browser, card) == ["echo approved-ok"], what="the first approval card")
    shoot(browser, "approval")
    press(browser, "Allow once")
    wait_for(lambda: texts(browser, card) == ["echo always-ok"], what="the second approval card")
    press(browser, "Always allow")
    wait_for(lambda: texts(browser, card) == ["echo denied-ok"], what="the third approval card")
    press(browser, "Deny")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".message.assistant table"), what="the answer's table")
    assert texts(browser, ".card.approval .card-status") == [
        "allowed once; exit 0", "always allowed; exit 0", "always allowed (by an earlier always); exit 0", "denied"]
    assert texts(browser, output)[-1] == "approved-ok\nalways-ok\nalways-ok\nnot approved: the user denied it\n"

    send(browser, "run: import matplotlib.pyplot as plt", "plt.plot([1, 3, 2])", "plt.show()")
    plot = ".cell .images img"
    wait_for(lambda: browser.execute_script(
        f"const i = document.querySelector('{plot}'); return i && i.complete && i.naturalWidth > 100"),
        what="the plot as an image")
    wait_for(lambda: texts(browser, ".status .state") == ["idle"], what="the turn's end")
    status = texts(browser, ".status")[0]
    assert re.search(r"ctx [\d.]+k/128k", status) and re.search(r"[1-9][\d,]* tok", status), status
    assert browser.find_element(By.CSS_SELECTOR, ".status input[aria-label=Model]").get_attribute("value") == "fake"

    shoot(browser, "session")
    browser.set_window_size(390, 844)  # a phone: one column, nothing wider than the screen
    try:
        wait_for(lambda: browser.execute_script("return window.innerWidth") <= 400, what="the phone width")
        assert browser.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
        box = browser.find_element(By.CSS_SELECTOR, "textarea[aria-label=Message]")
        assert box.is_displayed() and box.rect["x"] >= 0 and box.rect["x"] + box.rect["width"] <= 390
        shoot(browser, "phone", 390, 844)
    finally:
        browser.set_window_size(1100, 900)
    browser.refresh()  # everything comes back from the daemon
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, plot), what="the plot after the reload")
    assert session in browser.current_url
    wait_for(lambda: any("then the second half." in t for t in texts(browser, answer)), what="the answer after the reload")
    shown = browser.find_element(By.TAG_NAME, "main").text
    assert "first\nsecond" in shown and "approved-ok" in shown and "always allowed; exit 0" in shown
    assert "turn interrupted" in shown and "steered: also mind the tests" in shown
    assert texts(browser, ".message.user .text")[0].startswith("run: import os, time\nprint('first'")

    model = browser.find_element(By.CSS_SELECTOR, ".status input[aria-label=Model]")
    model.send_keys(Keys.CONTROL, "a")
    model.send_keys("fake-2", Keys.ENTER)  # typed over: the session's model from its next turn
    with httpx2.Client(base_url=web.base, headers={"Authorization": f"Bearer {web.bearer}"}) as api:
        wait_for(lambda: api.get(f"/v1/sessions/{session}").json()["model"] == "fake-2", what="the model switched")
    assert console_errors(browser) == []  # no CSP violation, no script error


class _Catcher(http.server.BaseHTTPRequestHandler):
    """A server elsewhere on this machine (a cell could start one): what the browser sends it."""

    seen: list[str] = []

    def do_GET(self) -> None:
        self.seen.append(f"{self.path} cookie={self.headers.get('Cookie')}")
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_hostile_text_from_the_model_and_a_cell_shows_as_text_and_runs_nothing(web, browser):
    catcher = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Catcher)
    threading.Thread(target=catcher.serve_forever, daemon=True).start()
    leak = f"![chart](http://127.0.0.1:{catcher.server_port}/leak.png)"
    try:
        login(browser, web)
        new_session(browser, web)
        send(browser, XSS + " " + leak)  # the first prompt: the session's title; the model echoes it
        send(browser, "xss")
        send(browser, f"run: print({XSS!r})")
        wait_for(lambda: len(texts(browser, ".cell pre.output")) == 1 and texts(browser, ".cell pre.output")[0],
                 what="the cell's output")
        wait_for(lambda: any(t.startswith("The cell said") for t in texts(browser, ".message.assistant .text")),
                 what="the last answer")
        assert browser.execute_script("return window.__pwned") is None
        with pytest.raises(NoAlertPresentException):
            browser.switch_to.alert.text
        conversation = browser.find_element(By.CSS_SELECTOR, ".conversation")
        assert conversation.find_elements(By.CSS_SELECTOR, "img, script, iframe, [onerror]") == []
        assert [a.get_attribute("href") for a in conversation.find_elements(By.TAG_NAME, "a")] == []
        shown = conversation.text
        for part in ('<img src=x onerror="window.__pwned=1">', "<script>window.__pwned=2</script>",
                     "[click me](javascript:window.__pwned=3)", '<a href="javascript:window.__pwned=4">link</a>'):
            assert shown.count(part) >= 4, part  # the prompt, its echo, the answer, the cell's output
        assert shown.count(leak) >= 2  # the prompt and its echo: a markdown image is its source text, nothing fetched
        shoot(browser, "hostile")

        browser.get(web.base + "/#/")
        wait_for(lambda: any(XSS[:40] in t for t in texts(browser, ".session-row .title")), what="the hostile title")
        assert browser.execute_script("return window.__pwned") is None
        assert _Catcher.seen == []
        assert console_errors(browser) == []
    finally:
        catcher.shutdown()


def test_the_page_without_a_login_shows_a_login_box_and_no_session(web, browser):
    login(browser, web)
    new_session(browser, web)
    send(browser, "a private prompt")
    wait_for(lambda: any("echo: a private prompt" in t for t in texts(browser, ".message.assistant .text")),
             what="the answer")
    browser.delete_all_cookies()
    browser.execute_script("localStorage.clear()")
    for page in (web.base + "/", browser.current_url):
        browser.get(page)
        wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "input[aria-label=Token]"), what="the login box")
        shoot(browser, "login", 700, 560)
        assert "a private prompt" not in browser.page_source
        assert browser.find_elements(By.CSS_SELECTOR, ".session-row, .message") == []
    token = web.url.split("token=")[1]
    box = browser.find_element(By.CSS_SELECTOR, "input[aria-label=Token]")
    box.send_keys(token, Keys.ENTER)  # the login box takes the token too
    wait_for(lambda: any("echo: a private prompt" in t for t in texts(browser, ".message.assistant .text")),
             what="the session after logging in")
    browser.get(web.base + "/#/")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, ".session-row"), what="the sessions list")
    shoot(browser, "sessions")


def test_a_refinement_is_reviewed_diffed_and_rolled_back_a_turn_rewound_and_a_plan_approved(web, browser):
    login(browser, web)
    new_session(browser, web)
    send(browser, "run: open('notes.txt', 'w').write('one')")
    wait_for(lambda: len(texts(browser, ".message.assistant .text")) == 1, what="the first answer")
    send(browser, "run: open('notes.txt', 'w').write('two')")
    wait_for(lambda: len(texts(browser, ".message.assistant .text")) == 2, what="the second answer")
    wait_for(lambda: "+two" in browser.find_element(By.CSS_SELECTOR, ".conversation").get_attribute("textContent"),
             what="the cell's diff of notes.txt")

    press(browser, "Harness")
    wait_for(lambda: "nothing in force yet" in browser.find_element(By.CSS_SELECTOR, ".harness").text, what="the panel")
    press(browser, "Refine now")
    wait_for(lambda: _buttons(browser, "Approve"), what="the refinement waiting for review")
    assert "Run the tests with" in browser.find_element(By.CSS_SELECTOR, ".card.refinement pre").text  # its diff
    press(browser, "Approve")
    wait_for(lambda: "applied" in "".join(texts(browser, ".card.refinement .card-status")), what="the refinement applied")
    press(browser, "Harness")  # closed, opened again: loaded afresh
    press(browser, "Harness")
    wait_for(lambda: "remember how this project runs its tests" in browser.find_element(By.CSS_SELECTOR, ".history").text,
             what="the change in the session scope's history")
    press(browser, "Diff")
    wait_for(lambda: "+Run the tests" in browser.find_element(By.CSS_SELECTOR, ".history .diff").text, what="its diff")
    press(browser, "Roll back")
    wait_for(lambda: "rolled back" in browser.find_element(By.CSS_SELECTOR, ".conversation").text, what="the rollback")
    press(browser, "Harness")

    browser.find_elements(By.CSS_SELECTOR, ".message.user button.link")[1].click()  # rewind to before turn 2
    press(browser, "Rewind")
    wait_for(lambda: "rewound to before turn 2" in browser.find_element(By.CSS_SELECTOR, ".conversation").text,
             what="the rewind")
    assert (web.project / "notes.txt").read_text() == "one"

    browser.get(web.base + "/#/")
    wait_for(lambda: _buttons(browser, "New session"), what="the sessions list")
    press(browser, "New session")
    browser.find_element(By.CSS_SELECTOR, "input[aria-label='Plan mode']").click()
    press(browser, "Create")
    wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, "textarea[aria-label=Message]"), what="the session view")
    send(browser, "run: propose_plan('1. write plan.txt')")
    wait_for(lambda: _buttons(browser, "Approve the plan"), what="the plan card")
    press(browser, "Approve the plan")
    wait_for(lambda: "approved" in "".join(texts(browser, ".card.plan .card-status")), what="the plan approved")
    assert console_errors(browser) == []
